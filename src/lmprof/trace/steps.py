"""``ProfilerStep#N`` annotations: one per ``prof.step()`` iteration, recorded on the host."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from lmprof.trace import kinds
from lmprof.trace.load import TraceTable


def profiler_steps(table: TraceTable) -> pd.DataFrame:
    """Host-side ``ProfilerStep#N`` events: columns row, step, ts, dur (us), sorted by ts.

    GPU-track copies (``gpu_user_annotation``, which ROCm traces also carry) are not steps.
    """
    rows, numbers = table.cache.get("profiler_steps", (None, None))
    if rows is None:  # the window, step figures and critical path all ask: find them once per table
        host = kinds.cat_mask(table, lambda c: c in kinds.ANNOTATION_CATS or c in kinds.OP_CATS)
        named = kinds.name_mask(table, lambda n: kinds.step_number(n) is not None)
        rows = np.flatnonzero(host & named)
        names = table.events["name"].cat  # every row here has a name (code >= 0)
        step_of = {c: kinds.step_number(str(names.categories[c])) for c in np.unique(names.codes.to_numpy()[rows]).tolist()}
        numbers = np.array([step_of[c] for c in names.codes.to_numpy()[rows].tolist()], dtype=np.int64)
        rows.setflags(write=False)
        numbers.setflags(write=False)
        table.cache["profiler_steps"] = (rows, numbers)
    ev = table.events
    # a new frame each call (callers may change it), over the cached read-only rows
    return pd.DataFrame(
        {
            "row": rows.copy(),
            "step": numbers.copy(),
            "ts": ev["ts"].to_numpy()[rows],
            "dur": ev["dur"].to_numpy()[rows],
        }
    )


@dataclass(frozen=True)
class StepRow:
    """One ProfilerStep."""

    step: int
    start_us: float  # relative to the first step's start
    dur_ms: float


@dataclass(frozen=True)
class StepStats:
    """Duration of the profiled steps, in milliseconds; measured from ProfilerStep annotations."""

    count: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    steps: list[StepRow]


def step_stats(table: TraceTable) -> StepStats | None:
    """Statistics of ProfilerStep#N durations, or None when the trace has no step annotations."""
    steps = profiler_steps(table)
    if steps.empty:
        return None
    ms = steps["dur"].to_numpy() / 1000.0
    t0 = float(steps["ts"].iloc[0])
    return StepStats(
        count=len(ms),
        median_ms=float(np.median(ms)),
        p10_ms=float(np.percentile(ms, 10)),
        p90_ms=float(np.percentile(ms, 90)),
        mean_ms=float(ms.mean()),
        min_ms=float(ms.min()),
        max_ms=float(ms.max()),
        steps=[
            StepRow(step=int(s), start_us=float(ts - t0), dur_ms=float(d))
            for s, ts, d in zip(steps["step"], steps["ts"], ms)
        ],
    )
