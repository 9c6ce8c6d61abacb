"""How busy the machine was while lmprof measured: other processes' CPU use, load, threads.

A loaded machine gives confident nonsense (a 21 ms step measured as 230 ms, profiler overhead of
+44% then -4%), so every timed window is bracketed by a :class:`Snapshot` and the run says when
other work competed with it. On Linux the figure is exact: the machine's busy CPU time from
``/proc/stat`` minus this process's own CPU time, over the window's wall time, is how many cores
other processes kept busy. Elsewhere only the 1-minute load average is available.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant; compare two with :func:`other_cores`."""

    wall_s: float
    machine_busy_s: float | None  # all processes' CPU time since boot (Linux), seconds
    own_cpu_s: float  # this process's user + system CPU time, seconds
    loadavg_1m: float | None
    threads: int  # torch intra-op threads in use
    cpus: int


def _machine_busy_s() -> float | None:
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: busy is everything but idle and iowait.
    ticks = [int(x) for x in fields[1:]]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def snapshot() -> Snapshot:
    """The counters now."""
    t = os.times()
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return Snapshot(
        wall_s=time.perf_counter(),
        machine_busy_s=_machine_busy_s(),
        own_cpu_s=t.user + t.system,
        loadavg_1m=load,
        threads=torch.get_num_threads(),
        cpus=os.cpu_count() or 1,
    )


def other_cores(before: Snapshot, after: Snapshot) -> float | None:
    """Cores kept busy by other processes between two snapshots (None where it can't be known)."""
    if before.machine_busy_s is None or after.machine_busy_s is None:
        return None
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return None
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_cpu_s - before.own_cpu_s)
    return max(others / wall, 0.0)
