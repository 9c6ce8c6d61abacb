"""How far long work has come (a run's steps, its generations, the trace's reading), told to whoever
listens: the CLI draws it (``cli/common.py``: a status line with step i/N and an ETA, or plain lines in a
log); the library alone is silent. A listener's failure never reaches the work.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """One report: the stage ("step", "generation", "reading the trace"), and ``done`` of ``total`` where
    the stage counts (``done`` items finished)."""

    stage: str
    done: int | None = None
    total: int | None = None


Listener = Callable[[Progress], None]
_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send every report to ``listener`` while the block runs."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def report(stage: str, done: int | None = None, total: int | None = None) -> None:
    """Tell the listeners (none: nothing happens)."""
    if not _listeners:
        return
    event = Progress(stage, done, None if total is None or done is None else max(total, done))
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception:  # noqa: BLE001 - a progress line must never stop a measurement
            pass
