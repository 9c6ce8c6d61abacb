"""Compare two traces (before, after): per annotation path, CPU operator and kernel name, the count
and time deltas, with names found in only one trace marked new or vanished.

Times: annotations by inclusive host time, operators by self time, kernels by summed duration (all
microseconds, summed over the trace). With several ProfilerSteps in the "before" trace, the spread
of its step times is reported as the noise a time delta has to exceed to mean something.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmprof.errors import DataError
from lmprof.trace import kinds
from lmprof.trace.annotations import annotation_breakdown
from lmprof.trace.kernels import kernel_breakdown, operator_breakdown
from lmprof.trace.load import TraceTable
from lmprof.trace.steps import step_stats

KINDS = ("annotation", "operator", "kernel")
SCHEMA = "lmprof.analyze.diff/1"


@dataclass(frozen=True)
class DiffRow:
    """One name in either trace."""

    kind: str  # annotation | operator | kernel
    name: str  # an annotation's path ("outer > inner"), else the name
    status: str  # changed | new | vanished (names equal in count and time are left out)
    count_before: int
    count_after: int
    before_us: float
    after_us: float
    delta_us: float
    delta_pct: float | None  # of before_us; None when the name is new


@dataclass(frozen=True)
class DiffReport:
    """Two traces compared; rows ranked by the size of their time delta, largest first."""

    before: str
    after: str
    rows: list[DiffRow]  # the ``top`` largest per kind
    summary: dict[str, dict[str, int]]  # kind -> {changed, new, vanished, unchanged}: names
    step_before_ms: float | None  # median ProfilerStep, when the trace has steps
    step_after_ms: float | None
    # (p90 - p10) / median of the before trace's steps: time deltas below it are within noise
    noise_pct: float | None
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, floats rounded as in the analyze report."""
        from lmprof.trace.analyze import _clean

        return dict(_clean(dataclasses.asdict(self)))


def _frame(table: TraceTable) -> pd.DataFrame:
    """kind, name, count, us of every annotation path, operator and kernel name in one trace."""
    parts = []
    ann = annotation_breakdown(table)
    if ann is not None:
        parts.append(pd.DataFrame({"kind": "annotation", "name": [r.path for r in ann.rows],
                                   "count": [r.count for r in ann.rows], "us": [r.total_us for r in ann.rows]}))  # fmt: skip
    ops = operator_breakdown(table, top=2**62).top
    parts.append(pd.DataFrame({"kind": "operator", "name": [r.name for r in ops], "count": [r.count for r in ops],
                               "us": [r.self_us for r in ops]}))  # fmt: skip
    dev = np.flatnonzero(kinds.device_mask(table))
    if dev.size:
        ks = kernel_breakdown(table, dev, top=2**62).top
        parts.append(pd.DataFrame({"kind": "kernel", "name": [r.name for r in ks], "count": [r.count for r in ks],
                                   "us": [r.total_us for r in ks]}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def diff_tables(before: TraceTable, after: TraceTable, top: int = 10) -> DiffReport:
    """Compare two loaded traces."""
    merged = _frame(before).merge(_frame(after), on=["kind", "name"], how="outer", suffixes=("_b", "_a"),
                                  indicator=True)  # fmt: skip
    for c in ("count_b", "count_a"):
        merged[c] = merged[c].fillna(0).astype(np.int64)
    for c in ("us_b", "us_a"):
        merged[c] = merged[c].fillna(0.0)
    merged["delta"] = merged["us_a"] - merged["us_b"]
    merged["status"] = np.select(
        [merged["_merge"] == "right_only", merged["_merge"] == "left_only",
         (merged["count_a"] != merged["count_b"]) | (merged["delta"] != 0)],
        ["new", "vanished", "changed"], "unchanged",
    )  # fmt: skip
    summary = {k: {s: int(((merged["kind"] == k) & (merged["status"] == s)).sum())
                   for s in ("changed", "new", "vanished", "unchanged")} for k in KINDS}  # fmt: skip
    shown = merged[merged["status"] != "unchanged"].assign(size=lambda f: f["delta"].abs())
    shown = shown.sort_values(["size", "kind", "name"], ascending=[False, True, True], kind="stable")
    shown = shown.groupby("kind", sort=False).head(top)
    rows = [
        DiffRow(kind=str(r.kind), name=str(r.name), status=str(r.status), count_before=int(r.count_b),
                count_after=int(r.count_a), before_us=float(r.us_b), after_us=float(r.us_a),
                delta_us=float(r.delta), delta_pct=100.0 * float(r.delta) / float(r.us_b) if r.us_b > 0 else None)
        for r in shown.itertuples()
    ]  # fmt: skip
    sb, sa = step_stats(before), step_stats(after)
    noise = None
    if sb is not None and sb.count >= 3 and sb.median_ms > 0:
        noise = 100.0 * (sb.p90_ms - sb.p10_ms) / sb.median_ms
    return DiffReport(before=before.path, after=after.path, rows=rows, summary=summary,
                      step_before_ms=sb.median_ms if sb else None, step_after_ms=sa.median_ms if sa else None,
                      noise_pct=noise)  # fmt: skip


def diff_paths(before: str | Path, after: str | Path, top: int = 10) -> DiffReport:
    """Load and compare two single traces (a trace file or a run folder holding one trace)."""
    from lmprof.trace.analyze import find_traces, load_tables

    tables = []
    for p in (before, after):
        files = find_traces(p)
        if len(files) != 1:
            raise DataError(f"{p}: --diff compares two single traces; this holds {len(files)}")
        loaded = load_tables(files[0])  # an Nsight Systems export holds one table per process
        if len(loaded) != 1:
            raise DataError(f"{p}: --diff compares two single traces; this export holds {len(loaded)} processes")
        tables.append(loaded[0])
    return diff_tables(tables[0], tables[1], top)
