"""``lmprof plots SWEEP_DIR``: PNG plots of a sweep into SWEEP_DIR/plots/."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import console


@app.command()
def plots(
    sweep_dir: Path = typer.Argument(..., help="A sweep folder (written by lmprof sweep)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the PNGs [default: SWEEP_DIR/plots]"),
) -> None:
    """Plot a sweep: per-block time, sub-blocks, throughput, energy, MFU, radar, roofline (those that apply)."""
    from lmprof.show.sweep_plots import make_plots

    results = make_plots(sweep_dir, out)
    written = [r for r in results if r.path is not None]
    skipped = [r for r in results if r.path is None]
    for r in written:
        console.print(f"wrote   {r.path}")
    for r in skipped:
        console.print(f"skipped {r.name}: {r.skipped}")
    console.print(f"{len(written)} plots written, {len(skipped)} skipped")
