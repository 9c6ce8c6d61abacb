"""``lmprof analyze``: what a torch.profiler (Kineto) trace says about where the time went."""
from __future__ import annotations

from pathlib import Path

import typer

from lmprof.cli._analyze_run import run_analyze
from lmprof.cli.app import app


@app.command()
def analyze(
    path: Path = typer.Argument(
        ...,
        help="A trace (.json or .json.gz), a folder with one trace per rank, or an lmprof run folder.",
        show_default=False,
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON instead of tables (schema: docs/trace-analysis.md)."
    ),
    top: int = typer.Option(10, "--top", min=1, help="How many kernels and CPU operators to list."),
    export: Path = typer.Option(
        None,
        "--export",
        help="Also write SQL-ready Parquet tables (events, kernels, launches, ops, steps, collectives, "
        "critical_path) to this folder "
        "(columns: docs/trace-analysis.md; needs pyarrow).",
        show_default=False,
    ),
    diff: Path = typer.Option(
        None,
        "--diff",
        help="The trace before a change, compared with the PATH argument, the trace after it: "
        "`lmprof analyze --diff BEFORE AFTER`. "
        "Per annotation, operator and kernel: count and time deltas, new and vanished names.",
        show_default=False,
    ),
    include_last_step: bool = typer.Option(
        False,
        "--include-last-step",
        help="Keep device work launched in the last ProfilerStep (HTA leaves it out by default).",
    ),
    annotate: Path = typer.Option(
        None,
        "--annotate",
        help="Also write a copy of the trace with lmprof's findings added as tracks (steps with their "
        "phases, device idle gaps by cause, dead windows, memory counters) for Perfetto / chrome://tracing; "
        "gzipped when OUT ends in .gz.",
        show_default=False,
    ),
    device: str = typer.Option(
        None,
        "--device",
        help="Place each operator of a record_shapes trace on this device's roofline (a100, h100, mi300x, "
        "...; `lmprof roofline --list-devices`). Default: the trace's deviceProperties name, when known.",
        show_default=False,
    ),
) -> None:
    """Analyse a torch.profiler trace: device time, idle causes, launches, top kernels/ops, ranks.

    Every figure is measured from the trace; device time follows HolisticTraceAnalysis's definitions
    (docs/trace-analysis.md). Works on CPU-only, ROCm and multi-rank traces.
    """
    # the work is in a module without typer, which the fast path of lmprof.cli.main calls too
    run_analyze(path, json_out=json_out, top=top, export=export, diff=diff, include_last_step=include_last_step,
                annotate=annotate, device=device, echo=typer.echo)
