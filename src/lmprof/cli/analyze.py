"""``lmprof analyze``: what a torch.profiler (Kineto) trace says about where the time went."""
from __future__ import annotations

from pathlib import Path

import typer

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
        help="Compare this trace (before) with PATH (after): `lmprof analyze --diff BEFORE AFTER`. "
        "Per annotation, operator and kernel: count and time deltas, new and vanished names.",
        show_default=False,
    ),
    include_last_step: bool = typer.Option(
        False,
        "--include-last-step",
        help="Keep device work launched in the last ProfilerStep (HTA leaves it out by default).",
    ),
) -> None:
    """Analyse a torch.profiler trace: device time, idle causes, launches, top kernels/ops, ranks.

    Every figure is measured from the trace; device time follows HolisticTraceAnalysis's definitions
    (docs/trace-analysis.md). Works on CPU-only, ROCm and multi-rank traces.
    """
    # heavy imports here, so `lmprof --help` stays fast
    if diff is not None:
        from lmprof.trace.diff import diff_paths

        compared = diff_paths(diff, path, top=top)
        if json_out:
            import orjson

            typer.echo(orjson.dumps(compared.to_dict(), option=orjson.OPT_INDENT_2).decode())
            return
        from lmprof.show.analyze_view import render_diff

        render_diff(compared)
        return
    from lmprof.trace.analyze import analyze_path

    report = analyze_path(path, top=top, include_last_step=include_last_step, export=export)
    if json_out:
        import orjson

        typer.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    from lmprof.show.analyze_view import render

    render(report)
    if export is not None:
        from lmprof.trace.export import TABLES

        typer.echo(f"tables written to {export}/ ({', '.join(f'{t}.parquet' for t in TABLES)})")
