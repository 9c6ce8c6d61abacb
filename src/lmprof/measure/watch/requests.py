"""Capture requests from outside the script: SIGUSR2, or a file named ``capture`` touched in the run folder.

Both are cheap to check at a step boundary: the signal handler only sets a flag (Python runs it
between bytecodes of the main thread, so it never interrupts lmprof mid-write), and the file is looked
for at most once per ``period_s`` of the host clock, with one ``unlink`` (a request is consumed when
seen, so one ``touch`` asks for one capture). The handler is installed only when the program has none
of its own for SIGUSR2 (default action), only from the main thread, and removed at close when it is
still lmprof's.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Literal

CAPTURE_FILE = "capture"
Request = Literal["signal", "file"]


class SignalRequests:
    """A flag set by SIGUSR2 (where the platform has it and the program does not handle it itself)."""

    def __init__(self) -> None:
        self.signum: int | None = getattr(signal, "SIGUSR2", None)
        self._flag = False
        self._ours: Any = None
        self.note: str | None = None

    @property
    def installed(self) -> bool:
        return self._ours is not None

    def install(self) -> bool:
        """Install the handler when allowed; else :attr:`note` says why not."""
        if self.signum is None:
            self.note = "no SIGUSR2 on this platform: touch the run folder's 'capture' file instead"
            return False
        if threading.current_thread() is not threading.main_thread():
            self.note = "the watch started outside the main thread: no SIGUSR2 handler (touch 'capture' instead)"
            return False
        if signal.getsignal(self.signum) is not signal.SIG_DFL:
            self.note = "the program handles SIGUSR2 itself, so lmprof installed no handler (touch 'capture' instead)"
            return False
        self._ours = self._handler
        signal.signal(self.signum, self._ours)
        return True

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._flag = True

    def take(self) -> bool:
        """True once per signal received since the last take."""
        got, self._flag = self._flag, False
        return got

    def uninstall(self) -> None:
        """Put the default action back, unless someone replaced lmprof's handler meanwhile."""
        if self._ours is None or self.signum is None:
            return
        if threading.current_thread() is threading.main_thread() and signal.getsignal(self.signum) is self._ours:
            signal.signal(self.signum, signal.SIG_DFL)
        self._ours = None


class FileRequests:
    """``<folder>/capture``, consumed when seen; looked for at most once per ``period_s``."""

    def __init__(self, folder: str | Path, period_s: float = 1.0):
        self.path = Path(folder) / CAPTURE_FILE
        self.period_s = period_s
        self._last = float("-inf")
        self.note: str | None = None

    def poll(self, now: float) -> bool:
        """True when the file was there (it is removed); ``now`` is the host clock in seconds."""
        if now - self._last < self.period_s:
            return False
        self._last = now
        try:
            os.unlink(self.path)  # one call: a symlink named 'capture' is removed, never its target
        except FileNotFoundError:
            return False
        except OSError as exc:
            if self.note is None:
                why = "it is a folder" if exc.errno in (errno.EISDIR, errno.EPERM) else (exc.strerror or str(exc))
                self.note = f"{self.path} cannot be consumed as a capture request ({why}): ignored"
            return False
        return True


class CaptureRequests:
    """Both sources together: :meth:`poll` at each step boundary names the one that asked."""

    def __init__(self, folder: str | Path, *, signals: bool = True, period_s: float = 1.0):
        self.signals = SignalRequests()
        self.file = FileRequests(folder, period_s)
        if signals:
            self.signals.install()

    def poll(self, now: float) -> Request | None:
        if self.signals.take():
            return "signal"
        if self.file.poll(now):
            return "file"
        return None

    def notes(self) -> list[str]:
        return [n for n in (self.signals.note, self.file.note) if n]

    def close(self) -> None:
        self.signals.uninstall()
