"""``ProfilerStep#N`` annotations: one per ``prof.step()`` iteration, recorded on the host."""
from __future__ import annotations


import numpy as np

from lmprof.trace import kinds
from lmprof.trace.frame import Frame
from lmprof.trace.groups import distinct, median, percentile
from lmprof.trace.load import TraceTable
from lmprof.trace.records import Record


def profiler_steps(table: TraceTable) -> Frame:
    """Host-side ``ProfilerStep#N`` events: columns row, step, ts, dur (us), sorted by ts.

    GPU-track copies (``gpu_user_annotation``, which ROCm traces also carry) are not steps.
    """
    rows, numbers = table.cache.get("profiler_steps", (None, None))
    if rows is None:  # the window, step figures and critical path all ask: find them once per table
        host = kinds.cat_mask(table, lambda c: c in kinds.ANNOTATION_CATS or c in kinds.OP_CATS)
        named = kinds.name_mask(table, lambda n: kinds.step_number(n) is not None)
        rows = np.flatnonzero(host & named)
        ev = table.event_cols
        labels, codes = ev.labels("name"), ev["name"]  # every row here has a name (code >= 0)
        step_of = {c: kinds.step_number(str(labels[c])) for c in distinct(codes[rows]).tolist()}
        numbers = np.array([step_of[c] for c in codes[rows].tolist()], dtype=np.int64)
        rows.setflags(write=False)
        numbers.setflags(write=False)
        table.cache["profiler_steps"] = (rows, numbers)
    ev = table.event_cols
    # a new frame each call (callers may change it), over the cached read-only rows
    return Frame(
        {
            "row": rows.copy(),
            "step": numbers.copy(),
            "ts": ev["ts"][rows],
            "dur": ev["dur"][rows],
        }
    )


def step_of(table: TraceTable, ts: np.ndarray) -> np.ndarray:
    """Number of the ProfilerStep whose span [start, end) holds each time, or -1."""
    steps = profiler_steps(table)
    out = np.full(len(ts), -1, dtype=np.int64)
    if steps.empty or len(ts) == 0:
        return out
    start = steps["ts"]
    end = start + np.maximum(steps["dur"], 0.0)
    k = np.searchsorted(start, ts, side="right") - 1
    ok = (k >= 0) & (ts < end[np.maximum(k, 0)])
    out[ok] = steps["step"][k[ok]]
    return out


class StepRow(Record, frozen=True):
    """One ProfilerStep."""

    step: int
    start_us: float  # relative to the first step's start
    dur_ms: float


class StepStats(Record, frozen=True):
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
    ms = steps["dur"] / 1000.0
    t0 = float(steps["ts"][0])
    return StepStats(
        count=len(ms),
        median_ms=median(ms),
        p10_ms=percentile(ms, 10),
        p90_ms=percentile(ms, 90),
        mean_ms=float(ms.mean()),
        min_ms=float(ms.min()),
        max_ms=float(ms.max()),
        steps=[
            StepRow(step=int(s), start_us=float(ts - t0), dur_ms=float(d))
            for s, ts, d in zip(steps["step"], steps["ts"], ms)
        ],
    )
