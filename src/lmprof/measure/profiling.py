"""The profiled phase: a few steps under torch.profiler, giving the trace and the operator table.

Block scopes are switched on only here. Times from this phase carry the profiler's overhead, which
the run reports (profiled vs clean step time) so nobody mistakes them for real ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from lmprof.record.run import OpStat
from lmprof.names import SCOPE_PREFIX
from lmprof.trace.load import TraceTable
from lmprof.trace.optable import op_rows


@dataclass
class ProfiledPhase:
    trace_path: Path
    ops: list[OpStat]  # filled from the trace once it is loaded (op_table)
    steps: int


def _activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def op_table(table: TraceTable, steps: int, top: int = 40) -> list[OpStat]:
    """The operator table per profiled step: each operator's median over ProfilerStep ranges
    1..``steps`` (torch's key_averages rule for self/total/device time, from lmprof's trace reader),
    lmprof's own scopes left out."""
    rows = op_rows(table, steps=steps, skip_prefixes=(SCOPE_PREFIX,))
    if not rows or steps <= 0:
        return []
    total_self = sum(r.self_us for r in rows) or 1.0
    return [
        OpStat(
            name=r.name,
            calls=int(round(r.count)),
            self_ms=r.self_us / 1e3,
            total_ms=r.total_us / 1e3,
            self_pct=100.0 * r.self_us / total_self,
            device_ms=(r.device_us / 1e3) if r.device_us else None,
        )
        for r in rows[:top]
    ]
