"""Run every trace analysis on one or many traces and return one typed report.

Entry points: :func:`analyze_path` (a trace file, a folder of per-rank traces, or an lmprof run
folder), :func:`analyze_tables` (already loaded tables) and :func:`analyze_table` (one table).
:meth:`Report.to_dict` gives the JSON documented in docs/trace-analysis.md. Every figure is measured
from the trace; times are microseconds (``*_us``) except step durations (``*_ms``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from lmprof.errors import DataError
from lmprof.trace import kinds
from lmprof.trace.kernels import KernelBreakdown, OperatorBreakdown, kernel_breakdown, operator_breakdown
from lmprof.trace.launches import LaunchStats, launch_stats
from lmprof.trace.load import TraceTable, load_trace
from lmprof.trace.ranks import RankComparison, compare_ranks, rank_row
from lmprof.trace.steps import StepStats, step_stats
from lmprof.trace.timeline import (
    IdleCauses,
    Overlap,
    Temporal,
    Window,
    idle_causes,
    select_device,
    temporal_breakdown,
)

SCHEMA = "lmprof.analyze/1"
NO_DEVICE = "no device activity in trace"
TIME_UNITS = "microseconds in *_us fields, milliseconds in *_ms fields; percentages in *_pct fields"
RUN_TRACE = "trace.json.gz"


@dataclass(frozen=True)
class DeviceReport:
    """Everything about the device timeline of one rank."""

    window: Window
    temporal: Temporal
    overlap: Overlap
    idle: IdleCauses
    launches: LaunchStats
    kernels: KernelBreakdown
    device_ids: list[int]  # args.device values seen on device events


@dataclass(frozen=True)
class TraceReport:
    """The analysis of one trace (one rank)."""

    path: str
    rank: int | None  # from distributedInfo
    events: int  # complete events in the trace
    host_span_us: float  # first host event start to last host event end
    device: DeviceReport | None  # None: no device activity (see ``device_note``)
    device_note: str | None
    operators: OperatorBreakdown
    steps: StepStats | None  # None when there are no ProfilerStep annotations


@dataclass(frozen=True)
class Report:
    """One or many traces; ``ranks`` compares them when there are several."""

    traces: list[TraceReport]
    ranks: RankComparison | None
    schema: str = SCHEMA
    source: str = "measured"  # every figure is read from the trace(s)
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict: floats rounded to ns (3 decimals of us), NaN as null."""
        d = dataclasses.asdict(self)
        head = {"schema": d.pop("schema"), "source": d.pop("source"), "time_units": TIME_UNITS}
        return _clean({**head, **d})


def analyze_table(table: TraceTable, *, top: int = 10, include_last_step: bool = False) -> TraceReport:
    """All analyses of one trace. Pure function of the table."""
    ev = table.events
    host = kinds.host_mask(table)
    host_span = 0.0
    if host.any():
        ts = ev["ts"].to_numpy()[host]
        host_span = float((ts + np.maximum(ev["dur"].to_numpy()[host], 0.0)).max() - ts.min())
    sel = select_device(table, include_last_step)
    device = None
    if sel is not None:
        temporal, overlap = temporal_breakdown(table, sel)
        dev_ids = ev["device"].to_numpy()[sel.rows]
        device = DeviceReport(
            window=sel.window,
            temporal=temporal,
            overlap=overlap,
            idle=idle_causes(table, sel),
            launches=launch_stats(table, sel.rows),
            kernels=kernel_breakdown(table, sel.rows, top),
            device_ids=sorted(int(d) for d in np.unique(dev_ids[dev_ids >= 0])),
        )
    return TraceReport(
        path=table.path,
        rank=table.rank,
        events=len(ev),
        host_span_us=host_span,
        device=device,
        device_note=None if device else NO_DEVICE,
        operators=operator_breakdown(table, top),
        steps=step_stats(table),
    )


def analyze_tables(tables: Iterable[TraceTable], *, top: int = 10, include_last_step: bool = False) -> Report:
    """Analyse each table; with several, compare them as the ranks of one job."""
    reports = [analyze_table(t, top=top, include_last_step=include_last_step) for t in tables]
    return combine(reports)


def combine(reports: list[TraceReport]) -> Report:
    """Wrap per-trace reports into a :class:`Report`, comparing ranks when there are several."""
    notes: list[str] = []
    if len(reports) < 2:
        return Report(traces=reports, ranks=None, notes=notes)
    ranks = [r.rank for r in reports]
    if any(r is None for r in ranks):
        notes.append("some traces have no distributedInfo rank: ranks numbered by file order")
        ranks = list(range(len(reports)))
    elif len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise DataError(f"several traces claim rank {dup[0]}: give one trace per rank")
    order = sorted(range(len(reports)), key=lambda i: ranks[i])
    reports = [reports[i] for i in order]
    rows = [rank_row(reports[k], ranks[i]) for k, i in enumerate(order)]
    return Report(traces=reports, ranks=compare_ranks(rows), notes=notes)


def find_traces(path: str | Path) -> list[Path]:
    """Trace files named by ``path``: the file itself, a run folder's trace, or a folder's traces."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"not found: {p}")
    if p.is_file():
        return [p]
    if (p / "run.json").is_file() or (p / RUN_TRACE).is_file():
        ranks = sorted(p.glob(f"rank*/{RUN_TRACE}"), key=lambda f: int(f.parent.name[4:] or 0))
        if not (p / RUN_TRACE).is_file() and ranks:  # a distributed run: one trace per rank
            return ranks
        if not (p / RUN_TRACE).is_file():
            raise DataError(f"{p} is an lmprof run folder without {RUN_TRACE} (no profiled phase recorded)")
        return [p / RUN_TRACE]
    files = sorted(
        f
        for f in p.iterdir()
        if f.is_file() and f.name.endswith((".json", ".json.gz")) and f.name != "run.json"
    )
    if not files:
        raise DataError(f"no trace files (*.json, *.json.gz) in {p}")
    return files


def analyze_path(path: str | Path, *, top: int = 10, include_last_step: bool = False) -> Report:
    """Load and analyse the trace(s) at ``path``, one at a time so only one table is in memory."""
    reports = []
    for f in find_traces(path):
        table = load_trace(f)
        reports.append(analyze_table(table, top=top, include_last_step=include_last_step))
        del table
    return combine(reports)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        f = float(x)
        return None if not math.isfinite(f) else round(f, 3)
    if isinstance(x, np.integer):
        return int(x)
    return x
