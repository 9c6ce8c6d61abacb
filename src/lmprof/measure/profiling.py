"""The profiled phase: a few steps under torch.profiler, giving the trace and the operator table.

Block scopes are switched on only here. Times from this phase carry the profiler's overhead, which
the run reports (profiled vs clean step time) so nobody mistakes them for real ones.
"""
from __future__ import annotations

import bisect
import contextlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from lmprof.atomic import atomic_path
from lmprof.record.run import OpStat
from lmprof.names import SCOPE_PREFIX
from lmprof.workloads.blocks import scopes_enabled


@dataclass
class ProfiledPhase:
    trace_path: Path
    ops: list[OpStat]
    steps: int


def _activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def profile_steps(
    step_fn: Callable[[], object],
    device: torch.device,
    trace_path: Path,
    active: int = 3,
    warmup: int = 1,
    top_ops: int = 40,
    scopes: bool = True,
    around: Callable[[], ContextManager[object]] | None = None,
) -> ProfiledPhase:
    """Profile ``active`` calls of ``step_fn`` (after ``warmup`` profiler warm-up calls).

    ``step_fn`` must synchronize the device before returning so each ProfilerStep range spans the
    step's device work. The Chrome trace goes to ``trace_path`` (gzipped when it ends in .gz).
    ``around`` is entered for the profiled phase only (e.g. module hooks that place block scopes).
    """
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    collected: dict[str, Any] = {}

    def on_ready(prof: profile) -> None:
        with atomic_path(trace_path) as tmp:  # keeps the .gz suffix, so torch still gzips it
            prof.export_chrome_trace(str(tmp))
        collected["events"] = prof.events()  # type: ignore[no-untyped-call]  # torch.profiler leaves events() unannotated

    sched = schedule(wait=0, warmup=warmup, active=active, repeat=1)
    with scopes_enabled(scopes), (around or contextlib.nullcontext)():
        with profile(activities=_activities(device), schedule=sched, on_trace_ready=on_ready) as prof:
            for _ in range(warmup + active):
                step_fn()
                prof.step()
    ops = _op_table(collected.get("events"), active, top_ops)
    return ProfiledPhase(trace_path=trace_path, ops=ops, steps=active)


_STEP_PREFIX = "ProfilerStep"


def _op_table(events: Sequence[Any] | None, steps: int, top: int) -> list[OpStat]:
    """torch.profiler's operator table (key_averages' figures), lmprof's own scopes left out, as the
    per-operator **median** over the first ``steps`` profiled steps, so one disturbed step cannot
    reorder the table (its mean would put whatever ran during the disturbance on top).

    Each event belongs to the ProfilerStep range it starts in; events in no range (a window's
    warm-up, gaps between a user's steps) and in ranges past the first ``steps`` (a step still open
    when the window closed) are left out.
    """
    if not events or steps <= 0:
        return []
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith(_STEP_PREFIX))
    starts = [a for a, _ in spans]
    per_step: list[dict[tuple[str, str], list[float]]] = [defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
                                                          for _ in range(steps if starts else 1)]
    for e in events:
        if e.key.startswith(SCOPE_PREFIX) or e.key.startswith(_STEP_PREFIX):
            continue
        k = bisect.bisect_right(starts, e.time_range.start) - 1 if starts else 0
        if k < 0 or k >= len(per_step) or (starts and e.time_range.start >= spans[k][1]):
            continue
        acc = per_step[k][(e.key, str(e.device_type))]
        acc[0] += 1
        acc[1] += e.self_cpu_time_total
        acc[2] += e.cpu_time_total
        acc[3] += getattr(e, "self_device_time_total", 0.0) or 0.0
    # Without step ranges (never under lmprof's own windows) the whole window counts once: its mean per step.
    divide = 1 if starts else steps
    keys = {k for s in per_step for k in s}
    zero = [0.0, 0.0, 0.0, 0.0]
    med = {k: [float(np.median([s.get(k, zero)[i] for s in per_step])) / divide for i in range(4)] for k in keys}
    total_self = sum(m[1] for m in med.values()) or 1.0
    ranked = sorted(med.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
    return [OpStat(name=key, calls=int(round(m[0])), self_ms=m[1] / 1e3, total_ms=m[2] / 1e3,
                   self_pct=100.0 * m[1] / total_self, device_ms=m[3] / 1e3 if m[3] else None)
            for (key, _), m in ranked]
