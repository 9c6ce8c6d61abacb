"""The machine-load rule at the counters' own resolution (issue 49, item 2).

/proc/stat and os.times count CPU time in clock ticks (10 ms on Linux): on a 13 ms window one tick
read as 0.77 "other" cores, and quiet runs of short steps were called noisy. The counter readings
here are made from the tick arithmetic alone, the independent truth: each CPU's counter advances one
tick at each of its tick instants at which it is busy, os.times floors this process's exact CPU time
to ticks, and the windows start at random phases of the tick grid (seeded, so every run is the same).
"""
from __future__ import annotations

import math
import random

import pytest

from lmprof.analysis.noise import ProfiledWindow, load_note, load_reason, noise_reasons
from lmprof.measure.noise import Snapshot, other_load

TICK = 0.01  # seconds: SC_CLK_TCK = 100, what Linux reports
CPUS, THREADS = 2, 1


def _ticks_in(start: float, end: float, phase: float) -> int:
    """Tick instants phase + k*TICK in [start, end): how many times a CPU busy all along is counted."""
    return math.ceil((end - phase) / TICK) - math.ceil((start - phase) / TICK)


def counters(rng: random.Random, window_s: float, others_busy_cpus: int = 0) -> tuple[Snapshot, Snapshot]:
    """Two snapshots around a window in which this process keeps one CPU busy (and ``others_busy_cpus``
    other CPUs are kept busy by another process), read as the kernel's tick counters would read them."""
    t0 = 1000.0 + rng.random()  # the window's start, anywhere in the tick grid
    t1 = t0 + window_s
    phases = [rng.random() * TICK for _ in range(CPUS)]  # each CPU ticks on its own phase
    busy = sum(_ticks_in(t0, t1, phases[i]) for i in range(THREADS + others_busy_cpus))
    machine0 = 5_000_000 * TICK
    own0 = 200.0 + rng.random()  # this process's exact CPU time so far; os.times floors it to ticks
    own1 = own0 + THREADS * window_s

    def snap(wall: float, machine: float, own: float) -> Snapshot:
        return Snapshot(wall_s=wall, machine_busy_s=machine, own_cpu_s=math.floor(own / TICK) * TICK,
                        loadavg_1m=None, threads=THREADS, cpus=CPUS, tick_s=TICK)

    return snap(t0, machine0, own0), snap(t1, machine0 + busy * TICK, own1)


def steps(rng: random.Random, n: int, ms: float) -> list[float]:
    return [ms * (1 + rng.gauss(0, 0.02)) for _ in range(n)]


COST_MS = 0.1  # the profiler's measured cost per step of a 1 ms step (events x cost per event)


def test_no_quiet_run_of_1ms_steps_is_flagged_in_20():
    rng = random.Random(49)
    too_short = 0
    for _ in range(20):
        n = rng.randint(5, 30)  # clean steps of 1 ms (lmprof train takes 10): windows of 5 to 30 ms
        clean = steps(rng, n, 1.0)
        before, after = counters(rng, sum(clean) / 1e3)
        profiled = ProfiledWindow(steps(rng, 3, 1.0 + COST_MS), cost_ms=COST_MS)
        assert noise_reasons(clean, "step", before, after, "cpu", profiled) == []
        note = load_note(before, after, "cpu")
        if note is not None:
            too_short += 1
            assert f"too short to judge: {sum(clean):.0f} ms window, counter resolution 10 ms" in note
    assert too_short > 0  # the short windows say so instead of guessing


def test_the_issue_window_13ms_reading_one_tick_is_too_short_to_judge():
    # 3 ms steps, 5 clean steps, a 13 ms window: one tick of another process's time reads 0.77 cores.
    before = Snapshot(wall_s=0.0, machine_busy_s=100.0, own_cpu_s=50.0, loadavg_1m=None, threads=1, cpus=2,
                      tick_s=TICK)
    after = Snapshot(wall_s=0.013, machine_busy_s=100.02, own_cpu_s=50.01, loadavg_1m=None, threads=1, cpus=2,
                     tick_s=TICK)
    load = other_load(before, after, "cpu")
    assert load is not None and load.cores == pytest.approx(0.01 / 0.013)
    assert load.uncertainty == pytest.approx(2 * 0.01 / 0.013)  # one tick per counter: the CPU kept busy + 1
    assert load_reason(before, after, "cpu") is None
    assert "too short to judge: 13 ms window, counter resolution 10 ms" in load_note(before, after, "cpu")


def test_a_2x_slower_profiled_window_is_flagged_in_20_of_20():
    rng = random.Random(4902)
    for _ in range(20):
        clean = steps(rng, 10, 1.0)
        before, after = counters(rng, sum(clean) / 1e3)
        quiet_profiled = steps(rng, 3, 1.0 + COST_MS)
        reasons = noise_reasons(clean, "step", before, after, "cpu",
                                ProfiledWindow([2 * s for s in quiet_profiled], cost_ms=COST_MS))
        assert len(reasons) == 1 and reasons[0].startswith("the profiled window (3 steps"), reasons


def test_another_process_on_the_free_core_is_still_seen_over_a_long_enough_window():
    rng = random.Random(4903)
    for _ in range(20):
        clean = steps(rng, 100, 1.0)  # 100 ms: the counters resolve a quarter core (2 ticks = 0.2 cores)
        before, after = counters(rng, sum(clean) / 1e3, others_busy_cpus=1)
        reason = load_reason(before, after, "cpu")
        assert reason is not None and "other processes kept" in reason
        assert load_note(before, after, "cpu") is None


def test_the_busy_boundary_by_hand():
    # 100 ms window, 1 thread on 2 cores: uncertainty (1 + 1) ticks / 0.1 s = 0.2 cores, limit 0.25 x 1 core.
    def pair(other_ticks: int) -> tuple[Snapshot, Snapshot]:
        b = Snapshot(wall_s=0.0, machine_busy_s=10.0, own_cpu_s=5.0, loadavg_1m=None, threads=1, cpus=2, tick_s=TICK)
        a = Snapshot(wall_s=0.1, machine_busy_s=10.0 + (10 + other_ticks) * TICK, own_cpu_s=5.1, loadavg_1m=None,
                     threads=1, cpus=2, tick_s=TICK)
        return b, a

    assert load_reason(*pair(4), "cpu") is None  # read 0.40: 0.40 - 0.20 = 0.20, within the limit
    reason = load_reason(*pair(5), "cpu")  # read 0.50: 0.50 - 0.20 = 0.30, beyond it
    assert reason is not None and "0.50 +- 0.20 of 2 cores" in reason
