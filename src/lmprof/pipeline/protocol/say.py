"""Where lmprof's own lines go inside someone else's program: the script's stderr, whatever it did to it.

A script may close ``sys.stderr`` (or replace it with something closed) before it ends; lmprof's run
summary and its one-line messages come after that, and a ``ValueError: I/O operation on closed file``
there turned the script's own exit code into lmprof's 1. Python opens ``sys.stderr`` over file
descriptor 2 without owning it, so closing it leaves the descriptor open: lmprof then writes there,
and when even that is gone, nowhere.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO

_fallback: TextIO | None = None


def err() -> TextIO:
    """``sys.stderr`` while it is open; else a stream on descriptor 2 (or the null device)."""
    global _fallback
    current = sys.stderr
    if current is not None and not getattr(current, "closed", False):
        return current
    if _fallback is None or _fallback.closed:
        try:
            os.fstat(2)
            _fallback = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - kept open
        except OSError:
            _fallback = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - kept open
    return _fallback


def say(line: str) -> None:
    """Print one of lmprof's lines (never raises: a reader that went away is not the script's failure)."""
    with contextlib.suppress(OSError, ValueError):
        stream = err()
        print(line, file=stream)
        stream.flush()


def flush() -> None:
    """Flush stdout and stderr where they are still open."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
