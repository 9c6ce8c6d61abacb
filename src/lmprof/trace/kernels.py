"""Top kernels by device time and top CPU operators by self time."""
from __future__ import annotations


import numpy as np

from lmprof.trace import kinds
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import self_time
from lmprof.trace.records import Record


class KernelRow(Record, frozen=True):
    """One kernel name (all its launches), microseconds."""

    name: str
    type: str  # computation | communication | memory
    count: int
    total_us: float
    mean_us: float
    max_us: float
    share_pct: float  # of the summed duration of all device events in the window


class KernelBreakdown(Record, frozen=True):
    """Device events grouped by name; durations are summed, so overlapping streams add up here."""

    count: int
    total_us: float
    by_type_us: dict[str, float]  # summed duration per kernel type
    top: list[KernelRow]


def kernel_breakdown(table: TraceTable, rows: np.ndarray, top: int = 10) -> KernelBreakdown:
    """Group the device ``rows`` by name and keep the ``top`` by total time."""
    ev = table.event_cols
    dur = np.maximum(ev["dur"][rows], 0.0)
    types = kinds.kernel_types(table, rows)
    codes = ev["name"][rows].astype(np.int64)
    names = ev.labels("name")
    total = float(dur.sum())
    by_type = {kinds.KERNEL_TYPE_NAMES[k]: float(dur[types == k].sum()) for k in range(3)}
    uniq, inv = np.unique(codes, return_inverse=True)
    sums = np.bincount(inv, weights=dur, minlength=len(uniq))
    counts = np.bincount(inv, minlength=len(uniq))
    maxes = np.zeros(len(uniq))
    np.maximum.at(maxes, inv, dur)
    kind = np.zeros(len(uniq), dtype=np.int8)
    kind[inv] = types
    out = []
    for i in np.argsort(-sums, kind="stable")[:top]:
        out.append(
            KernelRow(
                name=str(names[uniq[i]]) if uniq[i] >= 0 else "",
                type=kinds.KERNEL_TYPE_NAMES[int(kind[i])],
                count=int(counts[i]),
                total_us=float(sums[i]),
                mean_us=float(sums[i] / counts[i]),
                max_us=float(maxes[i]),
                share_pct=100.0 * float(sums[i]) / total if total > 0 else 0.0,
            )
        )
    return KernelBreakdown(count=len(rows), total_us=total, by_type_us=by_type, top=out)


class OperatorRow(Record, frozen=True):
    """One CPU operator name (all its calls), microseconds."""

    name: str
    count: int
    self_us: float  # duration minus direct children on the same thread
    total_us: float  # summed inclusive duration (nested calls of the same op count twice)
    mean_self_us: float
    share_pct: float  # of the self time of all CPU operators


class OperatorBreakdown(Record, frozen=True):
    """CPU operators (category cpu_op) grouped by name."""

    count: int
    self_us: float
    top: list[OperatorRow]


def operator_breakdown(table: TraceTable, top: int = 10) -> OperatorBreakdown:
    """Top ``cpu_op`` names by self time. Works on CPU-only traces too."""
    ev = table.event_cols
    rows = np.flatnonzero(kinds.op_mask(table))
    selfs = self_time(table)[rows]
    dur = np.maximum(ev["dur"][rows], 0.0)
    codes = ev["name"][rows].astype(np.int64)
    names = ev.labels("name")
    # one bin per name code (code -1, no name, in bin 0); bins of names with no operator are dropped,
    # leaving the distinct codes in increasing order, as np.unique would, without its sort
    counts = np.bincount(codes + 1, minlength=len(names) + 1)
    seen = np.flatnonzero(counts)
    uniq, counts = seen - 1, counts[seen]
    self_sum = np.bincount(codes + 1, weights=selfs, minlength=len(names) + 1)[seen]
    dur_sum = np.bincount(codes + 1, weights=dur, minlength=len(names) + 1)[seen]
    total_self = float(selfs.sum())
    out = []
    for i in np.argsort(-self_sum, kind="stable")[:top]:
        out.append(
            OperatorRow(
                name=str(names[uniq[i]]) if uniq[i] >= 0 else "",
                count=int(counts[i]),
                self_us=float(self_sum[i]),
                total_us=float(dur_sum[i]),
                mean_self_us=float(self_sum[i] / counts[i]),
                share_pct=100.0 * float(self_sum[i]) / total_self if total_self > 0 else 0.0,
            )
        )
    return OperatorBreakdown(count=len(rows), self_us=total_self, top=out)
