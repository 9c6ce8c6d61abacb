"""What lmprof placed in the user's code (optimizer and generate() triggers, forward hooks), removed once.

Each part that places a hook registers what removes it; the session runs them all when its hooks go
(the profiled window complete, the run ended, lmprof failed), each even when another one fails.
"""
from __future__ import annotations

import contextlib
from typing import Callable


class Releases:
    """The removals registered so far; :meth:`run` calls each once."""

    def __init__(self) -> None:
        self._fns: list[Callable[[], None]] = []

    def add(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once lmprof's hooks go."""
        self._fns.append(fn)

    def run(self) -> None:
        for fn in self._fns:
            with contextlib.suppress(Exception):
                fn()
        self._fns.clear()
