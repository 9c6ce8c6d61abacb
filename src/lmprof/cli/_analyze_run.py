"""What ``lmprof analyze`` does once its arguments are parsed, without typer.

:mod:`lmprof.cli.analyze` declares the command (typer) and calls :func:`run_analyze`; so does the
fast path of :mod:`lmprof.cli.main`, which parses a plain ``lmprof analyze PATH --json`` itself so
that the command imports neither typer nor pandas (a third of a second of start-up together).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def run_analyze(
    path: Path,
    *,
    json_out: bool = False,
    top: int = 10,
    export: Path | None = None,
    diff: Path | None = None,
    include_last_step: bool = False,
    annotate: Path | None = None,
    device: str | None = None,
    blocks: Path | None = None,
    model: str | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    workers: int | None = None,
    ray: str | None = None,
    sort: str = "inclusive",
    echo: Callable[[str], Any],
) -> None:
    """Analyse the trace(s) at ``path`` and print the report (JSON with ``json_out``); ``echo``
    prints one line (``typer.echo`` from the typer command). ``ray``: "local" or a Ray address.
    ``sort``: how the memory table is ranked (a key of :data:`lmprof.trace.opmemory.SORTS`; the JSON
    holds every ranking)."""
    from lmprof.trace.opmemory import SORTS

    if sort not in SORTS:
        from lmprof.errors import ConfigError

        raise ConfigError(f"--sort {sort!r}: use one of {', '.join(SORTS)}")
    # heavy imports here, so `lmprof --help` stays fast
    if path.is_file():
        from lmprof.trace.read import looks_like_snapshot

        if looks_like_snapshot(path):
            _snapshot(path, json_out, top, echo, other=[o for o, v in (("--diff", diff), ("--annotate", annotate),
                                                                    ("--export", export), ("--device", device),
                                                                    ("--blocks", blocks), ("--model", model)) if v])
            return
    block_map = _block_map(blocks) if blocks is not None else None
    model_entry = _model(model, batch, seq_len)  # an unknown model fails before the trace is read
    if diff is not None:
        from lmprof.trace.diff import diff_paths

        compared = diff_paths(diff, path, top=top)
        if json_out:
            from lmprof.printable import json_text

            echo(json_text(compared.to_dict()))
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
        _annotatable(path)
        from lmprof.trace.annotate import annotate_path

        report, added = annotate_path(path, annotate, top=top, include_last_step=include_last_step)
    else:
        from lmprof.trace.fanout import analyze_path

        report = analyze_path(path, top=top, include_last_step=include_last_step, export=export, blocks=block_map,
                              workers=workers, ray=ray)
    rooflines = [_roofline(tr, peaks) for tr in report.traces]
    flops = [_block_flops(tr, model_entry, batch, seq_len) for tr in report.traces]
    if json_out:
        from lmprof.printable import json_text

        from lmprof.trace.analyze import json_ready

        doc = report.to_dict()
        for tr, roof, bf in zip(doc["traces"], rooflines, flops):
            tr["op_roofline"] = None if roof is None else json_ready(roof.to_dict())
            if model_entry is not None:
                tr["block_flops"] = None if bf is None else json_ready(bf.to_dict())
        echo(json_text(doc))
        return
    from lmprof.show.analyze_view import render

    render(report, rooflines=rooflines, block_flops=flops, memory_sort=sort)
    if added is not None:
        echo(f"annotated trace written to {annotate} ({added:,} lmprof events added; open it in Perfetto)")
    if export is not None:
        from lmprof.trace.export import TABLES

        echo(f"tables written to {export}/ ({', '.join(f'{t}.parquet' for t in TABLES)})")


def _block_map(path: Path) -> Any:
    from lmprof.trace.blocks import read_block_map

    return read_block_map(path)


def _model(model: str | None, batch: int | None, seq_len: int | None) -> Any:
    """The --model entry, checked with its sizes before any trace is read (None without --model)."""
    from lmprof.errors import ConfigError

    if model is None:
        if batch is not None or seq_len is not None:
            raise ConfigError("--batch and --seq-len size the FLOPs of --model: give --model too")
        return None
    if batch is None or seq_len is None:
        raise ConfigError("--model needs --batch and --seq-len (the sizes one step ran with) to count FLOPs")
    from lmprof.estimate.models import resolve_model

    return resolve_model(model)


def _block_flops(tr: Any, entry: Any, batch: int | None, seq_len: int | None) -> Any:
    if entry is None or tr.blocks is None or batch is None or seq_len is None:
        return None
    from lmprof.analysis.block_flops import block_flops

    return block_flops(tr.blocks, entry.name, entry.shape, batch, seq_len)


def _annotatable(path: Path) -> None:
    """--annotate copies a Kineto JSON trace with findings added: refuse an Nsight Systems export."""
    from lmprof.errors import ConfigError
    from lmprof.trace.analyze import find_traces
    from lmprof.trace.nsys import is_nsys

    for f in find_traces(path):
        if is_nsys(f):
            raise ConfigError(f"--annotate adds lmprof's findings to a copy of a torch.profiler JSON trace; {f} is "
                              "an Nsight Systems export (open it in Nsight Systems; its figures are in this report)")


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


def _snapshot(path: Path, json_out: bool, top: int, echo: Callable[[str], Any], other: list[str]) -> None:
    """``lmprof analyze SNAPSHOT.pickle``: a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)."""
    from lmprof.errors import ConfigError
    from lmprof.trace.snapshot import read_snapshot, snapshot_report

    if other:
        raise ConfigError(f"{', '.join(other)} work on traces, not on a memory snapshot ({path})")
    report = snapshot_report(read_snapshot(path), str(path), top=top)
    if json_out:
        import dataclasses

        from lmprof.printable import json_text

        from lmprof.trace.analyze import json_ready

        echo(json_text(json_ready(dataclasses.asdict(report))))
        return
    from lmprof.show.analyze_view import render_snapshot

    render_snapshot(report)
