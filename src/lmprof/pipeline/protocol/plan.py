"""The protocol's phases, as a pure plan: which phase a step is in, and what each boundary opens or closes.

Steps (training steps, or generations: the same plan for both) are numbered from 1::

    warm-up            1 .. W        timed roughly; one is the figures step (figures_at), and in
                                     training, where a warm-up step follows it, FLOPs are counted
                                     on that one (flops_at)
    gap                W + 1         only with --steps 0 when the figures step is the last warm-up
                                     step: one plain step between its recording and the profiler
    clean              next S        device synchronized at each boundary, nothing else runs
    profiler warm-up   next 1        under the profiler, in no step range
    profiled           next P        under the profiler, each in a ProfilerStep range
    done               after         the run is assembled; the loop runs on unobserved

Every step is timed: clean steps are the run's figures; the others (warm-up, the gap, the profiler's
warm-up, the profiled steps) are kept as rough times, used (marked) only when no clean step was
timed, so any counts measure something from the first step on (:meth:`PhasePlan.layout` says what).
Nothing here touches a clock, a model or a profiler: the session asks the plan and acts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum


class Phase(str, Enum):
    """Where a step belongs."""

    WARMUP = "warm-up"
    GAP = "gap"
    CLEAN = "clean"
    PROFILER_WARMUP = "profiler warm-up"
    PROFILED = "profiled"
    DONE = "done"


@dataclass(frozen=True)
class PhasePlan:
    """Step counts and where the figures and FLOPs steps fall (0: no such step)."""

    warmup: int
    steps: int
    profile_steps: int
    figures_at: int = 0
    flops_at: int = 0

    @classmethod
    def of(cls, warmup: int, steps: int, profile_steps: int, *, figures_at: int, flops_apart: bool) -> "PhasePlan":
        """The plan for these counts; ``flops_apart``: FLOPs are counted on the warm-up step after the
        figures step (when there is one), not in it."""
        figures_at = max(0, min(figures_at, warmup))
        apart = flops_apart and 0 < figures_at < warmup
        return cls(warmup, steps, profile_steps, figures_at, figures_at + 1 if apart else figures_at)

    def with_steps(self, steps: int) -> "PhasePlan":
        """The same plan with a longer (or shorter) clean window."""
        return dataclasses.replace(self, steps=steps)

    @property
    def gap(self) -> int:
        """1 with ``--steps 0`` when the figures step is the last warm-up step: stopping kineto's memory
        recording (the figures step) and starting the window's profiler at one boundary corrupted
        kineto's memory trace (a segfault or std::bad_alloc when its results were freed, 5 of 12 runs on
        a busy CPU); a step between them ran clean every time. Without a figures step there (no warm-up,
        or a warm-up step after it) nothing records at that boundary, and no step is spent on it."""
        return 1 if self.steps == 0 and 0 < self.figures_at == self.warmup else 0

    @property
    def clean_steps(self) -> int:
        """Steps between warm-up and the profiler's warm-up step: the clean window, or the gap."""
        return self.steps + self.gap

    @property
    def first_clean(self) -> int:
        """The first step after warm-up (the clean window's first, or the gap)."""
        return self.warmup + 1

    @property
    def last_clean(self) -> int:
        """The last step before the profiler starts (the warm-up's last when there is no clean step)."""
        return self.warmup + self.clean_steps

    @property
    def profiler_warmup(self) -> int:
        """The step run under the profiler for its own warm-up: the profiler starts when it begins."""
        return self.last_clean + 1

    @property
    def needed(self) -> int:
        """Steps for the whole protocol; the profiled window completes when the last one ends."""
        return self.profiler_warmup + self.profile_steps

    @property
    def flops_apart(self) -> bool:
        """Whether FLOPs are counted on a warm-up step of their own (not in the figures step)."""
        return self.flops_at != self.figures_at

    def phase_of(self, step: int) -> Phase:
        """The phase of step ``step`` (1-based)."""
        if step <= self.warmup:
            return Phase.WARMUP
        if step <= self.last_clean:
            return Phase.GAP if self.gap else Phase.CLEAN
        if step == self.profiler_warmup:
            return Phase.PROFILER_WARMUP
        if step <= self.needed:
            return Phase.PROFILED
        return Phase.DONE

    def layout(self, unit: str) -> str:
        """What the plan measures, in words: '2 generations: 1 for the profiler's warm-up, 1 profiled'."""
        parts = [(self.warmup, "warm-up"), (self.gap, "between the figures step and the profiler"),
                 (self.steps, "clean (the run's figures)"), (1, "for the profiler's own warm-up"),
                 (self.profile_steps, "profiled")]
        return f"{self.needed} {unit}s: " + ", ".join(f"{n} {what}" for n, what in parts if n)

    def timed(self, step: int) -> bool:
        """Whether step ``step`` is a clean one (its time is the run's figure)."""
        return self.phase_of(step) is Phase.CLEAN

    def profiled_index(self, step: int) -> int:
        """Which profiled step ``step`` is (1-based; 0 for the profiler's warm-up step)."""
        return step - self.profiler_warmup

    # -- transitions: what a boundary opens and closes, the same for training steps and generations --
    def warmup_ends(self, step: int) -> bool:
        """Step ``step`` begins right after warm-up: the compile watch moves on, the clean window opens."""
        return step == self.first_clean

    def clean_begins(self, step: int) -> bool:
        """Step ``step`` is the first clean one: the energy meter and the noise counters start."""
        return step == self.first_clean and self.steps > 0

    def clean_ends(self, step: int) -> bool:
        """Step ``step`` is the last before the profiler's: the clean window closes when it ends."""
        return step == self.last_clean

    def window_starts(self, step: int) -> bool:
        """The profiler starts as step ``step`` begins (its own warm-up step)."""
        return step == self.profiler_warmup

    def window_completes(self, step: int) -> bool:
        """The profiled window is complete when step ``step`` ends."""
        return step == self.needed
