"""lmprof gives way to the user's own torch.profiler: two profilers cannot run at once in one process
(torch refuses, or kineto crashes), and a step timed under a profiler is not a clean step.

* A step (or generation) during which the user's profiler ran, at its start or at its end, is never
  timed, whatever its phase: no figure of lmprof's, clean or rough, comes from a step under it
  (:class:`Aside`). Once warm-up is over such a step is not counted either (neither timed nor
  profiled); in warm-up it still counts as a warm-up step (warm-up is there to warm caches, which it
  does under any profiler), untimed.
* A user's profiler that starts while one of lmprof's recordings runs stops lmprof's first: each
  window that records installs :class:`lmprof.measure.window.GiveWay` while it runs, and says what
  it dropped in a note.
"""
from __future__ import annotations

from typing import NamedTuple

from lmprof.measure.window import user_profiler_active


class Verdict(NamedTuple):
    """What the user's profiler means for the step that just ended."""

    tainted: bool  # it ran at the step's start or end: the step is not timed
    skip: bool  # ... and the step is not counted either (warm-up is over)
    busy: bool  # it runs now: the next step starts under it


class Aside:
    """Counts the steps lmprof stepped aside for, and decides which ones those are."""

    def __init__(self) -> None:
        self.count = 0  # steps not counted (after warm-up)
        self.untimed = 0  # warm-up steps counted but not timed
        self._busy = False  # the user's profiler was on at the last boundary

    @property
    def total(self) -> int:
        """Steps that ran under the user's profiler."""
        return self.count + self.untimed

    def _tally(self, skip: bool) -> None:
        if skip:
            self.count += 1
        else:
            self.untimed += 1

    def at_boundary(self, counted: int, warmup: int) -> Verdict:
        """A training step ends (``counted`` steps counted before it)."""
        busy = user_profiler_active()
        tainted, self._busy = busy or self._busy, busy
        skip = tainted and counted >= warmup
        if tainted:
            self._tally(skip)
        return Verdict(tainted, skip, busy)

    def at_generation_begin(self, counted: int, warmup: int) -> Verdict:
        """A generation begins under the user's profiler, or not."""
        busy = user_profiler_active()
        skip = busy and counted >= warmup
        if skip:
            self._tally(skip)
        return Verdict(busy, skip, busy)

    def at_generation_end(self, tainted: bool) -> bool:
        """A counted generation ends (``tainted``: the user's profiler ran as it began): whether it ran
        under the user's profiler (at its start or its end), so that it is not timed."""
        tainted = tainted or user_profiler_active()
        if tainted:
            self._tally(False)
        return tainted

    def note(self, unit: str) -> str | None:
        """The run's note, when lmprof stepped aside."""
        if not self.total:
            return None
        untimed = (f"; {self.untimed} of them in warm-up, counted as warm-up {unit}s but not timed" if self.untimed
                   and self.count else "")
        return (f"your own torch.profiler ran during {self.total} {unit}(s): lmprof stepped aside for them (it never "
                f"opens a profiler inside yours, and a {unit} timed under a profiler is not clean){untimed}; every "
                f"{unit} timed here ran outside it")

    def nothing_measured(self, what: str, unit: str, needed: int) -> str:
        """The message when every step ran under the user's profiler."""
        return (f"{what}: your own torch.profiler was running for {self.total} {unit}(s), and lmprof steps aside for "
                f"those (it never times a {unit} under your profiler): nothing measured, no clean figure exists; for "
                f"lmprof's figures, run without your profiler or leave it {needed} {unit}s outside it")
