"""``lmprof analyze``: what a torch.profiler (Kineto) trace says about where the time went."""
from __future__ import annotations

from pathlib import Path
from typing import Any

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
    # heavy imports here, so `lmprof --help` stays fast
    if path.is_file():
        from lmprof.trace.snapshot import looks_like_snapshot

        if looks_like_snapshot(path):
            _snapshot(path, json_out, top, other=[o for o, v in (("--diff", diff), ("--annotate", annotate),
                                                              ("--export", export), ("--device", device)) if v])
            return
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
    peaks = _peaks(device) if device is not None else None  # an unknown name fails before the trace is read
    added = None
    if annotate is not None:
        if export is not None:
            from lmprof.errors import ConfigError

            raise ConfigError("--annotate and --export: run them one at a time")
        from lmprof.trace.annotate import annotate_path

        report, added = annotate_path(path, annotate, top=top, include_last_step=include_last_step)
    else:
        from lmprof.trace.analyze import analyze_path

        report = analyze_path(path, top=top, include_last_step=include_last_step, export=export)
    rooflines = [_roofline(tr, peaks) for tr in report.traces]
    if json_out:
        import orjson

        from lmprof.trace.analyze import json_ready

        doc = report.to_dict()
        for tr, roof in zip(doc["traces"], rooflines):
            tr["op_roofline"] = None if roof is None else json_ready(roof.to_dict())
        typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    from lmprof.show.analyze_view import render

    render(report, rooflines=rooflines)
    if added is not None:
        typer.echo(f"annotated trace written to {annotate} ({added:,} lmprof events added; open it in Perfetto)")
    if export is not None:
        from lmprof.trace.export import TABLES

        typer.echo(f"tables written to {export}/ ({', '.join(f'{t}.parquet' for t in TABLES)})")


def _peaks(device: str) -> Any:
    from lmprof.errors import ConfigError
    from lmprof.hardware.peaks import find_device, load_table

    table = load_table()
    entry = find_device(device, table=table)
    if entry is None:
        raise ConfigError(f"unknown device {device!r} for --device: use one of {', '.join(table.short_names()[:40])}")
    return entry


def _roofline(tr: Any, peaks: Any) -> Any:
    """The per-op roofline of one trace: on ``--device``, else on the device the trace names."""
    if tr.op_flops is None:
        return None
    if peaks is None and tr.device_name:
        from lmprof.hardware.peaks import find_device

        peaks = find_device(tr.device_name, kind="cuda")
    if peaks is None:
        return None
    from lmprof.analysis.op_roofline import op_roofline

    return op_roofline(tr.op_flops, peaks.name, peaks.flops, peaks.bytes_per_s)


def _snapshot(path: Path, json_out: bool, top: int, other: list[str]) -> None:
    """``lmprof analyze SNAPSHOT.pickle``: a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)."""
    from lmprof.errors import ConfigError
    from lmprof.trace.snapshot import read_snapshot, snapshot_report

    if other:
        raise ConfigError(f"{', '.join(other)} work on traces, not on a memory snapshot ({path})")
    report = snapshot_report(read_snapshot(path), str(path), top=top)
    if json_out:
        import dataclasses

        import orjson

        from lmprof.trace.analyze import json_ready

        typer.echo(orjson.dumps(json_ready(dataclasses.asdict(report)), option=orjson.OPT_INDENT_2).decode())
        return
    from lmprof.show.analyze_view import render_snapshot

    render_snapshot(report)
