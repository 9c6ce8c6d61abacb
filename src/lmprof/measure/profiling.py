"""The profiled phase: a few steps under torch.profiler, giving the trace and the operator table.

Block scopes are switched on only here. Times from this phase carry the profiler's overhead, which
the run reports (profiled vs clean step time) so nobody mistakes them for real ones.
"""
from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from lmprof.atomic import atomic_path
from lmprof.record.run import OpStat
from lmprof.names import SCOPE_PREFIX
from lmprof.trace.load import TraceTable
from lmprof.trace.optable import op_rows


# Free bytes below which a trace export that wrote nothing is put down to a full disk.
_ROOM = 1 << 20


@dataclass
class ProfiledPhase:
    trace_path: Path
    ops: list[OpStat]  # filled from the trace once it is loaded (op_table)
    steps: int
    # The figures step's recording stands in (no profiled step completed): a warm-up step, a first call's,
    # recorded with memory events; not a profiled window to judge against the clean steps.
    stand_in: bool = False


def _activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def export_trace(prof: Any, path: Path) -> None:
    """torch's ``export_chrome_trace`` into ``path``, atomically, with a failed write made an error.

    Kineto writes to ``<file>.tmp`` and renames it; on a full disk it leaves that partial file and an
    empty ``<file>`` and raises nothing, so the empty file would have become the run's trace ("trace
    file is empty" later, the disk's state never said). Here the partial file is removed and an
    empty result raises (ENOSPC when the disk has no room left, else EIO), which the callers' write
    handling turns into one line naming the place.
    """
    with atomic_path(path) as tmp:
        partial = Path(f"{tmp}.tmp")
        try:
            prof.export_chrome_trace(str(tmp))
        finally:
            failed = partial.exists()
            partial.unlink(missing_ok=True)
        if failed or tmp.stat().st_size == 0:
            full = shutil.disk_usage(tmp.parent).free < _ROOM
            raise OSError(errno.ENOSPC if full else errno.EIO,
                          "no space left on device" if full else "torch's trace export wrote nothing", str(path))


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
