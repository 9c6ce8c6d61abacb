"""Clean timing: wall-clock time of whole steps with the device synchronized around each one.

No profiler runs here; the figures from this phase are the ones a user would see in production.
"""
from __future__ import annotations

import time
from typing import Callable


def time_calls(
    fn: Callable[[], object],
    n: int,
    sync: Callable[[], None],
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Run ``fn`` ``n`` times; return each call's duration in seconds.

    The device is synchronized before the start clock read (so earlier queued work is not billed to
    this call) and after ``fn`` returns (so the call's own asynchronous work is included).
    """
    samples: list[float] = []
    for _ in range(n):
        sync()
        start = clock()
        fn()
        sync()
        samples.append(clock() - start)
    return samples
