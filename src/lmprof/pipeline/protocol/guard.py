"""lmprof never raises into someone else's code: a failure inside a hook ends the session, one line says so.

* :func:`guarded` wraps every entry point lmprof's hooks call inside the user's step: an exception
  there ends the session (hooks removed, profiler stopped, what was already written kept) and prints
  one line; the user's step goes on as if lmprof were not there. Under lmprof's own loop (the
  driver's ``raises``) the session is abandoned and the error goes on: there is nothing to protect.
* :func:`safe_name` keeps labels and names taken from the user's code (script names, class names)
  inside the output folder as one plain path component.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import signal
import sys
import traceback
from typing import Any, Callable, Protocol, TypeVar

from lmprof.pid import this_pid

F = TypeVar("F", bound=Callable[..., Any])

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_NAME = 60  # a run folder's name also holds a time stamp, the mode and the device: stay far below 255 bytes


class Guarded(Protocol):
    """What :func:`run_guarded` needs of a session."""

    failed: bool
    done: bool
    pid: int

    @property
    def raises(self) -> bool: ...

    def fail(self, exc: BaseException) -> None: ...

    def abandon(self) -> None: ...


def safe_name(name: str, fallback: str = "script") -> str:
    """``name`` as one harmless path component: ASCII letters, digits and ``._+-``, no leading dot,
    at most MAX_NAME characters (``../../x`` -> ``x``, ``a/b`` -> ``a_b``)."""
    clean = _UNSAFE.sub("_", name).strip("._")
    return clean[:MAX_NAME].rstrip("._") or fallback


def why(exc: BaseException) -> str:
    """A failure in a few words: 'disk full', 'permission denied', else its type and message."""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk full"
        if exc.strerror:
            where = f": {exc.filename}" if exc.filename else ""
            return f"{exc.strerror.lower()}{where}"
    if isinstance(exc, RecursionError):
        return "symlink loop"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def failure_line(exc: BaseException, writing: bool, continues: bool) -> str:
    """The one line printed when lmprof fails inside the user's program."""
    what = "could not write the report" if writing else "stopped measuring"
    tail = "; your script continues" if continues else ""
    return f"lmprof: {what} ({why(exc)}){tail}"


def guarded(fn: F) -> F:
    """Run a session method so that nothing it raises reaches the caller (the user's step).

    On an exception the session's ``fail`` ends it. In a forked child nothing runs: the session
    belongs to the process that started it. ``BaseException``-s that are not errors
    (KeyboardInterrupt, SystemExit, lmprof's own StopScript) go through untouched.
    """

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_guarded(self, fn, self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # src/lmprof


def raised_by_a_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` came out of one of the script's signal handlers (a graceful exit on SIGTERM, an alarm's
    timeout), which Python runs wherever the main thread is, lmprof's hooks included: the script's, not lmprof's."""
    handlers = set()
    for signum in signal.valid_signals():
        with contextlib.suppress(ValueError, OSError):
            handler = signal.getsignal(signum)
            code = getattr(getattr(handler, "__func__", handler), "__code__", None)
            if code is not None and not code.co_filename.startswith(_PACKAGE):
                handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


def run_guarded(session: Guarded, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` for ``session`` as :func:`guarded` does (for hooks that are not the session's own
    methods: a trigger's, a window's)."""
    if session.failed or session.pid != this_pid():
        return None  # failed already, or a forked child: the session is its parent's
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        if raised_by_a_signal_handler(exc):
            if not session.done:
                session.fail(exc)  # the measurement ends here (its state is wherever the signal found it)
            raise  # to the script, whose handler raised it to leave what it was doing
        if session.raises:
            session.abandon()  # lmprof's own loop: nothing of the user's to protect, the error goes on
            raise
        if os.environ.get("LMPROF_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        session.fail(exc)
        return None
