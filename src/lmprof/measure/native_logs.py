"""Keep torch's C++ log lines about lmprof's own profiler windows off the terminal.

torch 2.13's kineto prints ``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start`` (and
``profiler_stop``) each time a profiler starts or stops, and c10 warns once per process
(``CPUAllocator.cpp:245``) when a memory profile sees a block freed that was allocated before it
started. lmprof starts the profiler several times a run; those lines say nothing to its user.

How they are kept off depends on who owns the process:

* **A process lmprof owns** (``lmprof train``, ``infer``, ``memory``, a sweep worker):
  :func:`quiet_process` sets torch's own level settings before torch reads them.
  ``KINETO_LOG_LEVEL=6``: kineto reads it once, when the first profiler of the process starts; its
  levels run VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5, and a message prints when its
  level is at least the setting, so 6 is the lowest that drops the USDT lines (3 to 5 do not).
  ``TORCH_CPP_LOG_LEVEL=ERROR``: c10 reads it when torch is imported; it drops the allocator warning.
  A level the user already set is kept. Child processes (torchrun ranks) inherit both.
* **The user's process** (``lmprof run``, ``lmprof.profile()``, the Trainer/Lightning callbacks):
  both settings are process-wide and fixed once read, so setting them would change what the user's
  own profiler prints. Instead :func:`native_logs_dropped` points file descriptor 2 at a temporary
  file only while lmprof's own profiler starts or stops (no user code runs then); afterwards
  everything written there is passed on to the real stderr except the native log lines.

``--verbose`` (or ``LMPROF_VERBOSE=1`` in the environment) turns both off: every line comes back.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

VERBOSE_ENV = "LMPROF_VERBOSE"
#: Above kineto's highest level (USDT = 5): nothing kineto logs is printed.
KINETO_SILENT = "6"
_ENV_LEVELS = {"KINETO_LOG_LEVEL": KINETO_SILENT, "TORCH_CPP_LOG_LEVEL": "ERROR"}

# kineto's prefix: "<LEVEL>:<date> <time> <pid>:<tid> <file>:<line>] "
_KINETO_LINE = re.compile(
    rb"^(?:VERBOSE|INFO|WARNING|STAGE|ERROR|USDT):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [^\]\s]+:\d+\] ")
# c10's (glog-like) prefix: "[W1126 00:37:53.774155731 CPUAllocator.cpp:245] " (a thread id may precede the file)
_C10_LINE = re.compile(rb"^\[[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d+)? [^\]\s]+:\d+\] ")
# kineto's bare line when a process's first profiler starts outside the main thread (a generate() in a
# streamer's thread): the start goes on and works; the line says nothing to lmprof's user
_KINETO_THREAD_LINE = re.compile(rb"^ERROR: External init callback must run in same thread as registerClient "
                                 rb"\(-?\d+ != -?\d+\)")


def verbose() -> bool:
    """Whether native log lines are wanted (``--verbose`` or ``LMPROF_VERBOSE=1``)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def set_verbose(on: bool) -> None:
    """``--verbose``: native log lines come back, here and in the processes this one starts."""
    if on:
        os.environ[VERBOSE_ENV] = "1"


def quiet_process(on_verbose: bool = False) -> dict[str, str]:
    """In a process lmprof owns, before torch is imported (else it does nothing): set kineto's and c10's log levels so
    profiler start/stop and allocator warnings are not printed. Returns the variables it set (none
    under ``--verbose``, none the user had already set)."""
    set_verbose(on_verbose)
    if verbose() or "torch" in sys.modules:
        # torch already imported: not a process lmprof started (a test, a notebook), and c10 has read
        # its level already; the caller's environment is left as it is.
        return {}
    done = {}
    for name, level in _ENV_LEVELS.items():
        if name not in os.environ:
            os.environ[name] = level
            done[name] = level
    return done


def is_native_line(line: bytes) -> bool:
    """Whether ``line`` is one of kineto's or c10's log lines (by their fixed prefixes)."""
    return bool(_KINETO_LINE.match(line) or _C10_LINE.match(line) or _KINETO_THREAD_LINE.match(line))


def drop_native_lines(data: bytes) -> bytes:
    """``data`` without kineto's and c10's log lines; everything else byte for byte."""
    return b"".join(ln for ln in data.splitlines(keepends=True) if not is_native_line(ln))


def _flush_stderr() -> None:
    with contextlib.suppress(Exception):  # a closed or replaced sys.stderr: nothing buffered to move
        sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextlib.contextmanager
def native_logs_dropped() -> Iterator[None]:
    """Around lmprof's own profiler start or stop in a process it does not own: torch's native log
    lines written to stderr meanwhile are dropped, anything else written there is passed on after.

    Only for calls that run none of the user's code: what they print to stderr would arrive late.
    Does nothing under ``--verbose``, or where stderr has no file descriptor to borrow.
    """
    if verbose():
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (a daemon, a closed stderr): nothing would reach a terminal anyway
        yield
        return
    _flush_stderr()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = drop_native_lines(sink.read())
            if kept:
                with contextlib.suppress(OSError):
                    _write_all(2, kept)
