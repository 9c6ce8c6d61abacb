"""``lmprof export``: a run folder (or every point of a sweep) to TensorBoard, MLflow or W&B."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app


@app.command()
def export(
    folder: Path = typer.Argument(..., help="A run folder, or a sweep folder (one tracker run per point)"),
    to: str = typer.Option(..., "--to", help="tensorboard, mlflow or wandb"),
    dest: Optional[str] = typer.Option(None, "--dest", help="Where: TensorBoard log folder [tensorboard]; MLflow "
                                       "tracking URI as given (sqlite:///mlflow.db, http://host:5000, databricks) or a "
                                       "file-store folder [MLFLOW_TRACKING_URI, else MLflow's default "
                                       "sqlite:///mlflow.db]; W&B run folder parent [.]"),
    project: str = typer.Option("lmprof", "--project", help="W&B project / MLflow experiment (a sweep: its name)"),
) -> None:
    """Log runs to an experiment tracker: figures with units, block times, plots, report and trace, config.

    Exporting a run again updates the same tracker run (its id is kept in the run folder)."""
    from lmprof.trackers import export_folder

    for where in export_folder(folder, to, dest, project=project):
        typer.echo(f"{to}: {where}")
