"""``lmprof report``: write the HTML report of a run folder or a sweep folder."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import console


@app.command()
def report(
    folder: Path = typer.Argument(..., help="A run folder (with run.json) or a sweep folder"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write [default: FOLDER/report.html]"),
) -> None:
    """Write a self-contained HTML report (opens offline) and print its path."""
    from lmprof.outdir import check_not_input
    from lmprof.show.report import write_report

    if out is not None:
        check_not_input(out, [folder, folder / "run.json"] if folder.is_dir() else [folder], "--out")
    with console.status("writing report..."):
        path = write_report(folder, out)
    typer.echo(str(path))
