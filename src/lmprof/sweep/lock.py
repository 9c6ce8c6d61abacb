"""One writer per sweep folder: an exclusive lock that the operating system drops when its process dies.

A :class:`filelock.FileLock` on ``<sweep>/.lmprof-sweep.lock`` (``flock`` on POSIX, ``msvcrt`` locking
on Windows): a second ``lmprof sweep`` on the same folder fails at once with one line naming the
holder, and a SIGKILLed sweep never leaves a stale lock behind (the lock belongs to the open file,
which dies with the process).

The holder's pid, for that message only, lives in ``.lmprof-sweep.pid`` beside the lock, not in the
lock file: Windows forbids reading a locked file's bytes, and older filelock releases truncate the
lock file when a contender opens it. It is written after the lock is taken and removed on release,
so it is never read as the lock itself.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from lmprof.atomic import write_text
from lmprof.errors import ConfigError

LOCK_NAME = ".lmprof-sweep.lock"
PID_NAME = ".lmprof-sweep.pid"

# A worker's point lock lives as long as the worker process: referenced here so it is never
# garbage-collected (which would release it) while the worker still writes its run folder.
_HELD: list[FileLock] = []


def _holder(folder: Path) -> str:
    """`` (pid N)`` from the pid file, or nothing when it is missing or unreadable."""
    try:
        pid = (folder / PID_NAME).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


@contextlib.contextmanager
def sweep_lock(folder: str | Path) -> Iterator[None]:
    """Hold the sweep folder's lock for the ``with`` block, or raise ConfigError when another process has it."""
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    # thread_local=False: the lock belongs to the process (a listener thread must not see it free).
    lock = FileLock(where / LOCK_NAME, thread_local=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise ConfigError(f"another lmprof sweep{_holder(where)} is running in {folder}: wait for it to finish, "
                          f"or use another --out") from None
    pid_file = where / PID_NAME
    try:
        write_text(pid_file, str(os.getpid()))
        yield
    finally:
        with contextlib.suppress(OSError):
            pid_file.unlink()
        lock.release()


def point_lock_path(run_dir: Path) -> Path:
    """The lock a worker holds while it writes ``run_dir`` (beside it, so emptying the folder keeps it)."""
    return run_dir.parent / f".{run_dir.name}.lock"


def hold_point_lock(run_dir: Path) -> FileLock:
    """Take the point's lock for the rest of this (worker) process, waiting for any earlier holder."""
    path = point_lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, thread_local=False)
    lock.acquire()
    _HELD.append(lock)
    return lock


def wait_point_free(run_dir: Path, timeout_s: float = 15.0) -> bool:
    """Wait until no process holds the point's lock (a worker orphaned by a killed sweep exits within a
    second or two); True when it is free, False after ``timeout_s``."""
    path = point_lock_path(run_dir)
    if not path.exists():
        return True
    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=timeout_s, poll_interval=0.1)
    except Timeout:
        return False
    lock.release()
    return True
