"""The largest batch size whose estimated peak fits a memory budget."""
from __future__ import annotations

from typing import Callable

from lmprof.estimate.memory.result import MemoryEstimate


def largest_fitting_batch(budget: int, estimate_at: Callable[[int], MemoryEstimate], limit: int = 1 << 20) -> int:
    """The largest batch size b with ``estimate_at(b).peak <= budget`` (0 when not even 1 fits).

    Peak memory grows with the batch size, so a doubling search then a bisection finds it in
    O(log b) estimates.
    """
    if estimate_at(1).peak > budget:
        return 0
    lo = 1
    hi = 2
    while hi <= limit and estimate_at(hi).peak <= budget:
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_at(mid).peak <= budget:
            lo = mid
        else:
            hi = mid
    return lo
