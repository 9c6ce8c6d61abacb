"""Whether timed steps follow a steady trend: each step slower (or faster) than the one before, by a
steady amount, rather than scattered around one time.

Some loops do more work each step: L-BFGS's two-loop recursion grows with its history, a
sequence-length curriculum lengthens the batches, tensors kept alive slow the allocator; a laptop's
clocks fall as it heats. Their steps spread as widely as a disturbed run's, but in order: read as
noise, the run would blame "something else" for its own work, and a profiled step later in the
run would read as disturbed by exactly the growth the clean steps already showed.

A trend here is a monotone order (Kendall's tau of step time against step index at
:data:`MIN_TAU` or more, over :data:`MIN_STEPS` steps or more) around a straight line (Theil-Sen:
the median of the pairwise slopes, so one disturbed step does not tilt it) that leaves the steps
agreeing with it as a steady run agrees with its median (p90/p10 of step / line within the spread
limit of analysis/noise.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_STEPS = 6  # fewer steps: an order among them is too likely by chance (tau >= 0.7 for 5 of 5: 1 in 60)
MIN_TAU = 0.7
MAX_PAIRS_STEPS = 256  # the pairwise statistics read at most this many steps, evenly spaced (a long window)


@dataclass(frozen=True)
class Trend:
    """A straight line through the timed steps, ms against the step's index in the window (0-based)."""

    intercept_ms: float
    slope_ms: float  # ms per step: > 0 the steps grow, < 0 they shrink
    tau: float  # Kendall's tau of time against index
    steps: int
    residual_ratio: float  # p90 / p10 of step time / the line's: how closely the steps keep to it

    def at(self, index: float) -> float:
        """The line's time at step ``index`` of the window (beyond its end: where the trend leads)."""
        return self.intercept_ms + self.slope_ms * index

    def describe(self, what: str) -> str:
        """E.g. 'step times grew steadily through the clean window, from 7.1 to 18.7 ms (+1.29 ms a step)'."""
        first, last = self.at(0), self.at(self.steps - 1)
        verb = "grew" if self.slope_ms > 0 else "fell"
        return (f"{what} times {verb} steadily through the clean window, from {first:.3g} to {last:.3g} ms "
                f"({self.slope_ms:+.3g} ms a {what}, Kendall's tau {self.tau:.2f}; around that line they vary "
                f"{self.residual_ratio:.2f}x)")


def steady_trend(samples_ms: list[float], spread_limit: float) -> Trend | None:
    """The trend the samples follow, or None: too few, no monotone order, or scattered around the line by
    more than ``spread_limit`` (p90/p10 of sample / line)."""
    y = np.asarray(samples_ms, dtype=float)
    n = len(y)
    if n < MIN_STEPS or not np.all(np.isfinite(y)) or np.any(y <= 0):
        return None
    x = np.arange(n, dtype=float)
    pick = np.unique(np.linspace(0, n - 1, min(n, MAX_PAIRS_STEPS)).round().astype(int))
    i, j = np.triu_indices(len(pick), k=1)
    dx, dy = x[pick][j] - x[pick][i], y[pick][j] - y[pick][i]
    tau = float(np.sign(dy).sum() / len(dy))
    if abs(tau) < MIN_TAU:
        return None
    slope = float(np.median(dy / dx))
    intercept = float(np.median(y - slope * x))
    line = intercept + slope * x
    if np.any(line <= 0):
        return None  # a line through zero is no step time: not a trend this rule describes
    p10, p90 = np.percentile(y / line, [10, 90])
    ratio = float(p90 / p10)
    if ratio > spread_limit:
        return None
    return Trend(intercept, slope, tau, n, ratio)
