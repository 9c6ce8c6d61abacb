"""How a profiled script ends when something other than its last line ends it.

* SIGTERM (``timeout``, Slurm, Kubernetes, ``docker stop``): what was measured is written, one line
  says so, then the process dies of the signal, as it would have without lmprof (exit status 128+15
  seen from a shell). SIGINT goes through Python's own KeyboardInterrupt and ends the same way.
  Either one that arrives while a run is written is held until the write is done (:func:`holding_signals`).
* ``--stop-after`` raises StopScript into the script once the run is written. A loop with a bare
  ``except:`` swallows it; the next optimizer step or model forward then ends the process: atexit
  handlers run, stdout and stderr are flushed, and it exits 0 (``os._exit``: nothing else can be
  relied on to get out of a loop that catches everything).
* A forked child never measures (the session belongs to its pid, see guard.guarded); a child forked
  while lmprof's profiler runs leaves without Python's finalization, which would wait forever in the
  profiler's teardown inherited from the parent.
"""
from __future__ import annotations

import atexit
import functools
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from lmprof.pipeline.protocol import say


class StopScript(BaseException):
    """Raised into the user's code by ``--stop-after`` once the run is written (not an Exception, so
    a script's ``except Exception`` does not swallow it)."""


def die_by(signum: int) -> None:
    """End this process by ``signum`` with its default action, as an unhandled signal would."""
    say.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def holding_signals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` (a run being written) with SIGINT and SIGTERM held: one that arrives meanwhile takes effect
    as ``fn`` returns, through the handler that was there (a KeyboardInterrupt, lmprof run's SIGTERM, the
    script's own), so a Ctrl-C or a ``kill`` in the middle of the write no longer leaves half a run folder
    (a trace and no run.json, nor the mark that says so). Off the main thread ``fn`` runs as it is."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread() or _holding:
            return fn(*args, **kwargs)
        got: list[int] = []
        held = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        held = {s: h for s, h in held.items() if h is not None}  # a handler set outside Python stays as it is
        for s in held:
            signal.signal(s, lambda signum, frame: got.append(signum))
        _holding.append(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _holding.clear()
            for s, h in held.items():
                signal.signal(s, h)
            if got:
                signal.raise_signal(got[0])  # its handler runs here (what it raises is the script's: guard.py)

    return wrapper


_holding: list[bool] = []  # a write in progress holds the signals already (finish inside finish returns at once)


class TermHandler:
    """While installed, SIGTERM calls ``on_term(name)`` (write and say so), then kills the process
    with SIGTERM. Not installed when the process already handles SIGTERM, or off the main thread."""

    def __init__(self, on_term: Callable[[str], None]):
        self.on_term = on_term
        self._old: Any = None
        self._pid = os.getpid()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self._old = signal.signal(signal.SIGTERM, self._handle)

    def remove(self) -> None:
        if self._old is not None and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._old)
        self._old = None

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() == self._pid:
            self.on_term(signal.Signals(signum).name)
        die_by(signum)


def exit_now(code: int, line: str | None = None) -> None:
    """Leave the process now with ``code``: atexit handlers, then stdio flushed, then ``os._exit``."""
    if line:
        say.say(line)
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - what Python's own exit would run
    finally:
        say.flush()
        os._exit(code)


class StopAgain:
    """After --stop-after's StopScript: if the script goes on anyway (it caught it), its next
    optimizer step or module forward ends the process (see module doc)."""

    def __init__(self, line: str):
        self.line = line
        self._handles: list[Any] = []

    def install(self) -> None:
        self._handles = [register_optimizer_step_pre_hook(self._stop),
                         torch.nn.modules.module.register_module_forward_pre_hook(self._stop)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @classmethod
    def after_writing(cls, folder: Path | None) -> StopAgain:
        """--stop-after: the run is written to ``folder``; installed before the session raises StopScript."""
        again = cls(f"--stop-after: stopped the script once the run was written to {folder}")
        again.install()
        return again

    def _stop(self, *args: Any, **kwargs: Any) -> None:
        exit_now(0, f"lmprof: {self.line} (the script caught lmprof's stop, so it was ended from its next step)")
