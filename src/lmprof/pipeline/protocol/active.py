"""The one session measuring this process (``lmprof run``, ``lmprof.profile()``, a callback).

Two would measure the same steps twice, so every door that observes someone else's loop registers
its session here and asks first. A child forked after lmprof's profiler ran learns it here too: it
must leave without Python's finalization, which would wait forever in the profiler's teardown
inherited from the parent (ending.py).
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmprof.pipeline.protocol.session import Session

_ACTIVE: list["Session"] = []
_LOCK = threading.Lock()  # two threads entering lmprof.profile() at once: one measures (two kineto sessions crash)


def _after_fork_in_child() -> None:
    for s in _ACTIVE:
        s.forked_in_window = s.kineto_ran  # kineto ran here: its teardown can hang a child, running or not


os.register_at_fork(after_in_child=_after_fork_in_child)


def active_session() -> "Session | None":
    """The session running in this process, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


def register(session: "Session") -> None:
    """``session`` measures this process from now on."""
    with _LOCK:
        _ACTIVE.append(session)


def claim(session: "Session") -> "Session | None":
    """Register ``session`` unless another one measures this process already: that one (``session``
    then measures nothing), else None. Checked and registered in one step, whatever thread asks."""
    with _LOCK:
        if _ACTIVE:
            return _ACTIVE[-1]
        _ACTIVE.append(session)
        return None


def release(session: "Session") -> bool:
    """``session`` no longer measures this process; False when it was not registered."""
    with _LOCK:
        if session in _ACTIVE:
            _ACTIVE.remove(session)
            return True
        return False
