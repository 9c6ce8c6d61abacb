"""How busy other processes kept the CPUs while something was measured, as the counters can tell it.

On Linux the figure is exact up to the counters' resolution: the machine's busy CPU time from
``/proc/stat`` minus this process's own CPU time (``os.times``), over the window's wall time, is how
many cores other processes kept busy. Elsewhere only the 1-minute load average is available.

Both counters count in clock ticks (``os.sysconf("SC_CLK_TCK")``, 100 a second on Linux: 10 ms). A
counter read twice is off by up to one tick either way, and the machine's is a sum over CPUs each
counted apart, so the difference is known to within one tick per CPU this process kept busy plus one
(:attr:`OtherLoad.uncertainty`). On a 13 ms window one tick reads as 0.77 cores: a quiet run of 3 ms
steps was called busy. So a window is judged busy only when the reading, less that uncertainty, is
above the limit, and a window whose uncertainty alone exceeds the limit is too short to judge and
says so (:meth:`OtherLoad.too_short`), instead of guessing. Every judgement of "other processes
competed" (a run's timed window, ``lmprof calibrate``, a run's quick bandwidth check) is this one.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_PROC_STAT = Path("/proc/stat")

#: Cores other processes kept busy, as a share of the cores the measured work's threads left free,
#: above which they competed with it (CPU work) or with its host thread (GPU work).
OTHER_CORES_LIMIT = 0.25


def tick_s() -> float:
    """The CPU-time counters' resolution in seconds: one clock tick (10 ms on Linux)."""
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): os.times' own 10 ms
        return 0.01


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant; compare two with :func:`other_load`."""

    wall_s: float
    machine_busy_s: float | None  # all processes' CPU time since boot (Linux), seconds
    own_cpu_s: float  # this process's user + system CPU time, seconds
    loadavg_1m: float | None
    threads: int  # torch intra-op threads in use
    cpus: int
    tick_s: float = field(default_factory=tick_s)  # both CPU-time counters count in these


def _machine_busy_s() -> float | None:
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: busy is everything but idle and iowait.
    try:
        ticks = [int(x) for x in fields[1:]]
    except ValueError:
        return None
    if len(ticks) < 4:
        return None
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy * tick_s()


def snapshot(threads: int | None = None) -> Snapshot:
    """The counters now; ``threads`` defaults to torch's intra-op thread count."""
    if threads is None:
        import torch  # lazy: reading a peak needs no torch

        threads = torch.get_num_threads()
    t = os.times()
    try:
        load: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    return Snapshot(wall_s=time.perf_counter(), machine_busy_s=_machine_busy_s(), own_cpu_s=t.user + t.system,
                    loadavg_1m=load, threads=threads, cpus=os.cpu_count() or 1)


def other_cores(before: Snapshot, after: Snapshot) -> float | None:
    """Cores kept busy by other processes between two snapshots, as read (None where it can't be known)."""
    load = other_load(before, after, "cpu")
    return None if load is None else load.cores


@dataclass(frozen=True)
class OtherLoad:
    """Other processes' CPU use over a window, with what the counters can resolve, in cores."""

    cores: float  # as read: (machine busy - own) / wall, at least 0
    uncertainty: float  # +- cores the ticks allow: (CPUs this process kept busy + 1) ticks over the window
    window_s: float
    tick_s: float
    free: int  # cores the measured work left free (at least 1)
    cpus: int

    @property
    def limit(self) -> float:
        """Cores others may keep busy before they competed: :data:`OTHER_CORES_LIMIT` of the free ones."""
        return OTHER_CORES_LIMIT * self.free

    @property
    def judgeable(self) -> bool:
        """Whether the counters resolve the limit over this window (else :meth:`too_short`)."""
        return self.uncertainty <= self.limit

    @property
    def busy(self) -> bool:
        """Others kept more than the limit busy, beyond the counters' uncertainty."""
        return self.judgeable and self.cores - self.uncertainty > self.limit

    def too_short(self) -> str:
        """The sentence for a window the counters cannot judge."""
        need = self.uncertainty * self.window_s / self.limit
        return (f"too short to judge: {1e3 * self.window_s:.0f} ms window, counter resolution "
                f"{1e3 * self.tick_s:.0f} ms (other processes' CPU time is counted in ticks; telling "
                f"{self.limit:.2g} of {self.cpus} cores apart needs a window of {1e3 * need:.0f} ms or more)")

    def reading(self) -> str:
        """What the counters read, with their uncertainty: '0.80 +- 0.02 of 2 cores'."""
        return f"{self.cores:.2f} +- {self.uncertainty:.2f} of {self.cpus} cores"


def other_load(before: Snapshot, after: Snapshot, device_kind: str) -> OtherLoad | None:
    """Other processes' load between two snapshots of work on ``device_kind`` (None where the counters
    are missing or the window is empty)."""
    if before.machine_busy_s is None or after.machine_busy_s is None:
        return None
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return None
    own = after.own_cpu_s - before.own_cpu_s
    others = (after.machine_busy_s - before.machine_busy_s) - own
    busy_cpus = min(max(before.threads, 1), before.cpus)
    free = max(before.cpus - (before.threads if device_kind == "cpu" else 0), 1)
    tick = before.tick_s
    return OtherLoad(cores=max(others / wall, 0.0), uncertainty=(busy_cpus + 1) * tick / wall, window_s=wall,
                     tick_s=tick, free=free, cpus=before.cpus)
