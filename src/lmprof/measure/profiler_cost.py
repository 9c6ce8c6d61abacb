"""What torch.profiler costs per recorded event on this machine, measured, so block times can drop it.

The profiler's cost is per event, not per unit of work: recording an operator costs about the
same for a 1-element add as for a 0.6 ms matmul. Scaling every block by one factor (clean step /
profiled step) therefore overstates blocks made of many small ops and understates matmul blocks.
This module times the same op stream with and without the profiler:

* ``op_us``: extra wall time per recorded CPU operator (a tiny ``torch.add``);
* ``scope_us``: extra wall time per ``record_function`` range (an empty ``lmprof:`` scope), and of
  that, ``scope_inside_us``: the part that lands inside the range itself (its duration in the
  profiler's own table for an empty range); the rest lands in the enclosing range.

Each figure is the median of several alternating repeats; the spread is kept so a run can say how
sure the correction is. On a device clock (CUDA) kernel durations are not inflated by host-side
recording, so the correction is used only for CPU-clock attribution.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from lmprof.measure.native_logs import native_logs_dropped
from lmprof.names import SCOPE_PREFIX
from lmprof.workloads.blocks import scope, scope_hook, scopes_enabled

_PROBE_NAME = "__cost_probe__"
_PROBE = SCOPE_PREFIX + _PROBE_NAME


@dataclass(frozen=True)
class EventCost:
    """Profiler cost per recorded event, microseconds; measured on this machine for this run."""

    op_us: float
    scope_us: float
    scope_inside_us: float
    op_spread_us: float  # p90 - p10 of the repeats
    scope_spread_us: float
    repeats: int

    @property
    def scope_outside_us(self) -> float:
        """The part of a range's cost that lands in the range around it."""
        return max(self.scope_us - self.scope_inside_us, 0.0)

    def to_dict(self) -> dict[str, float]:
        """Plain figures for the run record."""
        return {"op_us": self.op_us, "scope_us": self.scope_us, "scope_inside_us": self.scope_inside_us,
                "op_spread_us": self.op_spread_us, "scope_spread_us": self.scope_spread_us,
                "repeats": float(self.repeats)}


def _loop_ops(n: int, a: torch.Tensor, b: torch.Tensor) -> float:
    t = time.perf_counter()
    for _ in range(n):
        torch.add(a, b)
    return time.perf_counter() - t


def _loop_scopes(n: int) -> float:
    # lmprof's own scope(): a no-op while scopes are off (the clean phase), a range when on; with
    # no test hook (a stopwatch's own time must not pass for the scope's cost).
    with scope_hook(None):
        t = time.perf_counter()
        for _ in range(n):
            with scope(_PROBE_NAME):
                pass
        return time.perf_counter() - t


def _spread(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    qs = statistics.quantiles(xs, n=10)
    return qs[-1] - qs[0]


def _range_durations_us(prof: profile, name: str) -> list[float]:
    """Durations (us) of the CPU ranges called ``name``, read from kineto's own event list.

    torch's ``prof.events()`` would build a FunctionEvent tree over every recorded op first: most
    of a second per repeat here, for the few ranges this needs.
    """
    results = getattr(prof.profiler, "kineto_results", None) if prof.profiler is not None else None
    if results is None:  # a torch without kineto's result object: its own (slower) table
        return [e.cpu_time_total for e in prof.events() if e.name == name]  # type: ignore[no-untyped-call]
    return [e.duration_ns() / 1e3 for e in results.events() if e.name() == name and e.device_type() == DeviceType.CPU]


def measure_event_cost(n: int = 1000, repeats: int = 5) -> EventCost:
    """Per-event profiler cost on the CPU, from ``repeats`` alternating timings of ``n`` events.

    Takes about 0.15 s: twice as many events took twice as long, for a spread no narrower than the
    repeats vary by. Runs the profiler with the same activities lmprof's profiled phase uses on CPU
    (CPU operators, no shapes, no stacks).
    """
    a, b = torch.ones(1), torch.ones(1)
    _loop_ops(n, a, b), _loop_scopes(n)  # warm the dispatcher and the allocator
    # The clean phase runs with scopes off; the profiled phase with scopes on: that is the difference.
    op_diffs: list[float] = []
    scope_diffs: list[float] = []
    inside: list[float] = []
    for _ in range(repeats):
        plain_ops, plain_scopes = _loop_ops(n, a, b), _loop_scopes(n)
        with native_logs_dropped(), scopes_enabled(True, model=True), profile(activities=[ProfilerActivity.CPU]) as prof:
            prof_ops, prof_scopes = _loop_ops(n, a, b), _loop_scopes(n)
        op_diffs.append((prof_ops - plain_ops) / n * 1e6)
        scope_diffs.append((prof_scopes - plain_scopes) / n * 1e6)
        durs = _range_durations_us(prof, _PROBE)
        if durs:
            inside.append(statistics.median(durs))
    op_us = max(statistics.median(op_diffs), 0.0)
    scope_us = max(statistics.median(scope_diffs), 0.0)
    return EventCost(
        op_us=op_us,
        scope_us=scope_us,
        scope_inside_us=min(statistics.median(inside), scope_us) if inside else scope_us / 2,
        op_spread_us=_spread(op_diffs),
        scope_spread_us=_spread(scope_diffs),
        repeats=repeats,
    )


_cached: EventCost | None = None


def event_cost(refresh: bool = False) -> EventCost:
    """:func:`measure_event_cost`, measured once per process (it is a property of the machine and
    of torch's build; a process that profiles several runs pays the second of measuring once)."""
    global _cached
    if _cached is None or refresh:
        _cached = measure_event_cost()
    return _cached
