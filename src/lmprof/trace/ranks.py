"""Compare the ranks of one distributed job: who is slowest, by how much, and communication skew.

Reads rank rows only (:func:`lmprof.trace.analyze.rank_row` makes them from a trace's report), so
it imports nothing of the analysis facade.
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from lmprof.trace.groups import median


@dataclass(frozen=True)
class RankRow:
    """One rank's headline figures (None where the trace cannot give them)."""

    rank: int
    step_ms: float | None  # median ProfilerStep duration
    steps: int
    span_us: float | None  # device window
    compute_us: float | None
    communication_us: float | None  # communication with no compute running (temporal breakdown)
    communication_total_us: float | None  # union of communication kernels, overlapped or not
    memory_us: float | None
    idle_us: float | None
    idle_pct: float | None
    host_span_us: float  # first to last host event


@dataclass(frozen=True)
class RankComparison:
    """Slowest rank and communication skew across ranks; all measured from the traces.

    ``measure`` is what ranks are compared by: the median ProfilerStep duration when every rank has
    steps, else the device window span when every rank has device activity, else the host span.
    ``communication_skew_pct`` is (max - min) / mean of ``communication_total_us`` across ranks.
    """

    ranks: list[RankRow]
    measure: str  # step_ms | span_us | host_span_us
    slowest_rank: int
    fastest_rank: int
    slowest_over_fastest_pct: float | None  # (slowest - fastest) / fastest
    slowest_over_median_pct: float | None  # (slowest - median of ranks) / median
    communication_min_us: float | None
    communication_max_us: float | None
    communication_skew_us: float | None
    communication_skew_pct: float | None


def compare_ranks(rows: list[RankRow]) -> RankComparison:
    """Who is slowest, by how much, and how unevenly communication time is spread."""
    for measure in ("step_ms", "span_us", "host_span_us"):
        values = [getattr(r, measure) for r in rows]
        if all(v is not None for v in values):
            break
    vals = np.array(values, dtype=float)
    slow, fast = int(np.argmax(vals)), int(np.argmin(vals))
    med = median(vals)
    comm = [r.communication_total_us for r in rows]
    cmin: float | None = None  # no communication figures when a rank lacks them
    cmax: float | None = None
    skew_us: float | None = None
    skew_pct: float | None = None
    if all(c is not None for c in comm):
        c = np.array(comm, dtype=float)
        cmin, cmax, mean = float(c.min()), float(c.max()), float(c.mean())
        skew_us = cmax - cmin
        skew_pct = 100.0 * skew_us / mean if mean > 0 else None
    return RankComparison(
        ranks=rows,
        measure=measure,
        slowest_rank=rows[slow].rank,
        fastest_rank=rows[fast].rank,
        slowest_over_fastest_pct=100.0 * (vals[slow] - vals[fast]) / vals[fast] if vals[fast] > 0 else None,
        slowest_over_median_pct=100.0 * (vals[slow] - med) / med if med > 0 else None,
        communication_min_us=cmin,
        communication_max_us=cmax,
        communication_skew_us=skew_us,
        communication_skew_pct=skew_pct,
    )
