"""lmprof gives way to the user's own torch.profiler: two profilers cannot run at once in one process
(torch refuses, or kineto crashes), and a step timed under a profiler is not a clean step.

* A step (or generation) during which the user's profiler ran, at its start or at its end, is not
  counted once warm-up is over: it is neither timed nor profiled (:class:`Aside`).
* A user's profiler that starts while one of lmprof's recordings runs stops lmprof's first: each
  window that records installs :class:`lmprof.measure.window.GiveWay` while it runs, and says what
  it dropped in a note.
"""
from __future__ import annotations

from lmprof.measure.window import user_profiler_active


class Aside:
    """Counts the steps lmprof stepped aside for, and decides which ones those are."""

    def __init__(self) -> None:
        self.count = 0
        self._busy = False  # the user's profiler was on at the last boundary

    def at_boundary(self, counted: int, warmup: int) -> tuple[bool, bool]:
        """A training step ends (``counted`` steps counted before it): (not counted, the user's profiler
        is on now). A step whose start or end ran under it is not counted, once warm-up is over."""
        busy = user_profiler_active()
        tainted, self._busy = busy or self._busy, busy
        if not tainted or counted < warmup:
            return False, busy
        self.count += 1
        return True, busy

    def at_generation_begin(self, counted: int, warmup: int) -> bool:
        """A generation begins: True when it runs under the user's profiler (it is not counted)."""
        if counted >= warmup and user_profiler_active():
            self.count += 1
            return True
        return False

    def note(self, unit: str) -> str | None:
        """The run's note, when lmprof stepped aside."""
        if not self.count:
            return None
        return (f"your own torch.profiler ran during {self.count} {unit}(s): lmprof stepped aside for them (it never "
                f"opens a profiler inside yours, and a {unit} timed under a profiler is not clean); every {unit} "
                "measured here ran outside it")

    def nothing_measured(self, what: str, unit: str, needed: int) -> str:
        """The message when every step ran under the user's profiler."""
        return (f"{what}: your own torch.profiler was running for {self.count} {unit}(s), and lmprof steps aside for "
                f"those (it never runs inside your profiler): nothing measured; for lmprof's figures, run without "
                f"your profiler or leave it {needed} {unit}s outside it")
