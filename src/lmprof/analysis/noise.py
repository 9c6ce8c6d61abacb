"""Is a run's timing trustworthy? Reasons a run is noisy, from its samples and the machine's load.

Each rule gives a sentence with the figure behind it; a run with any is marked ``noisy`` in
run.json, and the summary, the report and sweep plots say so. Thresholds are stated here once.
"""
from __future__ import annotations

import numpy as np

from lmprof.measure.noise import Snapshot, other_cores

# p90 / p10 of the timed steps above this: the steps do not agree with each other.
SPREAD_LIMIT = 1.25
# Cores other processes kept busy during the timed window, as a share of the cores not in use by
# this run's threads, above which they competed for the CPU (CPU runs) or the host (GPU runs).
OTHER_CORES_LIMIT = 0.25
# Profiled step shorter than the clean one by more than this: noise exceeds the profiler's overhead.
NEGATIVE_OVERHEAD_PCT = -2.0


def spread_reason(samples_ms: list[float], what: str) -> str | None:
    """A sentence when the timed samples spread more than :data:`SPREAD_LIMIT`."""
    if len(samples_ms) < 3:
        return None
    p10, p90 = np.percentile(samples_ms, [10, 90])
    if p10 > 0 and p90 / p10 > SPREAD_LIMIT:
        return (f"{what} times vary {p90 / p10:.2f}x between p10 ({p10:.3g} ms) and p90 ({p90:.3g} ms); "
                f"steady runs stay under {SPREAD_LIMIT:.2f}x")
    return None


def load_reason(before: Snapshot, after: Snapshot, device_kind: str) -> str | None:
    """A sentence when other processes kept the machine busy during the timed window."""
    others = other_cores(before, after)
    if others is None:
        load = max(x for x in (before.loadavg_1m, after.loadavg_1m, 0.0) if x is not None)
        free = max(before.cpus - before.threads, 1) if device_kind == "cpu" else before.cpus
        if load > before.threads + OTHER_CORES_LIMIT * free:
            return f"1-minute load average {load:.1f} on {before.cpus} cores while this run used {before.threads} thread(s)"
        return None
    if others > OTHER_CORES_LIMIT * max(before.cpus - (before.threads if device_kind == "cpu" else 0), 1):
        return (f"other processes kept {others:.2f} of {before.cpus} cores busy during the timed window "
                f"(this run used {before.threads} thread(s))")
    return None


def overhead_reason(overhead_pct: float | None) -> str | None:
    """A sentence when the profiled phase ran clearly faster than the clean one."""
    if overhead_pct is not None and overhead_pct < NEGATIVE_OVERHEAD_PCT:
        return (f"the profiled phase ran {-overhead_pct:.1f}% faster than the clean one: run-to-run noise is "
                "larger than the profiler's own cost")
    return None


def noise_reasons(samples_ms: list[float], what: str, before: Snapshot, after: Snapshot, device_kind: str,
                  overhead_pct: float | None) -> list[str]:
    """Every reason the run's timing is not to be trusted as it stands (empty: a steady run)."""
    found = [spread_reason(samples_ms, what), load_reason(before, after, device_kind), overhead_reason(overhead_pct)]
    return [r for r in found if r]
