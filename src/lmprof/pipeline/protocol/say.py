"""Where lmprof's own lines go inside someone else's program: the script's stderr, whatever it did to it.

A script may close ``sys.stderr`` (or replace it with something closed) before it ends; lmprof's run
summary and its one-line messages come after that, and a ``ValueError: I/O operation on closed file``
there turned the script's own exit code into lmprof's 1. Python opens ``sys.stderr`` over file
descriptor 2 without owning it, so closing it leaves the descriptor open: lmprof then writes there,
and when even that is gone, nowhere.

The script's progress bars are left whole (show/console.py: tqdm's cleared and drawn again, rich's printed
above), so a summary printed as the profiled window completes, mid-training, does not start on the bar's line.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import TextIO, cast

from lmprof.show.console import beside_bars

_fallback: TextIO | None = None


def err() -> TextIO:
    """``sys.stderr`` while it is open; else a stream on descriptor 2 (or nowhere, when there is none)."""
    global _fallback
    current = sys.stderr
    if current is not None and not getattr(current, "closed", False):
        return current
    if _fallback is None or _fallback.closed:
        try:
            os.fstat(2)
            # the process's stderr itself (a stream, not a file lmprof writes: atomic.py is for files)
            _fallback = io.TextIOWrapper(io.FileIO(2, mode="w", closefd=False), encoding="utf-8", errors="replace",
                                         line_buffering=True)
        except OSError:
            _fallback = cast(TextIO, _Nowhere())
    return _fallback


class _Nowhere(io.TextIOBase):
    """Where lmprof's lines go when the process has no stderr at all."""

    def write(self, s: str) -> int:
        return len(s)


def say(line: str) -> None:
    """Print one of lmprof's lines (never raises: a reader that went away is not the script's failure)."""
    with contextlib.suppress(OSError, ValueError):
        stream = err()
        with beside_bars(stream):
            print(line, file=stream)
            stream.flush()


def flush() -> None:
    """Flush stdout and stderr where they are still open."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
