"""The profiled phase: a few steps under torch.profiler, giving the trace and the operator table.

Block scopes are switched on only here. Times from this phase carry the profiler's overhead, which
the run reports (profiled vs clean step time) so nobody mistakes them for real ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import contextlib
from typing import Callable, ContextManager

import torch
from torch.autograd.profiler_util import EventList
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
    collected: dict[str, EventList] = {}

    def on_ready(prof: profile) -> None:
        with atomic_path(trace_path) as tmp:  # keeps the .gz suffix, so torch still gzips it
            prof.export_chrome_trace(str(tmp))
        collected["averages"] = prof.key_averages()

    sched = schedule(wait=0, warmup=warmup, active=active, repeat=1)
    with scopes_enabled(scopes), (around or contextlib.nullcontext)():
        with profile(activities=_activities(device), schedule=sched, on_trace_ready=on_ready) as prof:
            for _ in range(warmup + active):
                step_fn()
                prof.step()
    ops = _op_table(collected.get("averages"), active, top_ops)
    return ProfiledPhase(trace_path=trace_path, ops=ops, steps=active)


def _op_table(averages: EventList | None, steps: int, top: int) -> list[OpStat]:
    """torch.profiler's key_averages as rows, per step, lmprof's own scopes left out."""
    if averages is None:
        return []
    rows = [
        e
        for e in averages
        if not e.key.startswith(SCOPE_PREFIX) and not e.key.startswith("ProfilerStep")
    ]
    total_self = sum(e.self_cpu_time_total for e in rows) or 1.0
    rows.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    out = []
    for e in rows[:top]:
        device_us = getattr(e, "self_device_time_total", None)
        out.append(
            OpStat(
                name=e.key,
                calls=int(round(e.count / steps)),
                self_ms=e.self_cpu_time_total / steps / 1e3,
                total_ms=e.cpu_time_total / steps / 1e3,
                self_pct=100.0 * e.self_cpu_time_total / total_self,
                device_ms=(device_us / steps / 1e3) if device_us else None,
            )
        )
    return out
