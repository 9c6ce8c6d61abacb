"""One writer per sweep folder: an exclusive lock that the kernel drops when its process dies.

``fcntl.flock`` on ``<sweep>/.lmprof-sweep.lock``: a second ``lmprof sweep`` on the same folder fails
at once with one line naming the holder, and a SIGKILLed sweep never leaves a stale lock behind (the
lock belongs to the open file, which dies with the process). The file itself is never deleted, so
two processes can never lock two different files of the same name.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from lmprof.errors import ConfigError

LOCK_NAME = ".lmprof-sweep.lock"


@contextlib.contextmanager
def sweep_lock(folder: str | Path) -> Iterator[None]:
    """Hold the sweep folder's lock for the ``with`` block, or raise ConfigError when another process has it."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; sweeps there are trusted to be run one at a time
        yield
        return
    path = Path(folder) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise ConfigError(f"another lmprof sweep{who} is running in {folder}: wait for it to finish, "
                              f"or use another --out") from None
        # The holder's pid, for the message above; informational only (the lock is the flock).
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def point_lock_path(run_dir: Path) -> Path:
    """The lock a worker holds while it writes ``run_dir`` (beside it, so emptying the folder keeps it)."""
    return run_dir.parent / f".{run_dir.name}.lock"


def hold_point_lock(run_dir: Path) -> int | None:
    """Take the point's lock for the rest of this (worker) process; returns the fd to keep it open."""
    try:
        import fcntl
    except ImportError:
        return None
    path = point_lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def wait_point_free(run_dir: Path, timeout_s: float = 15.0) -> bool:
    """Wait until no process holds the point's lock (a worker orphaned by a killed sweep exits within a
    second or two); True when it is free, False after ``timeout_s``."""
    import time

    try:
        import fcntl
    except ImportError:
        return True
    path = point_lock_path(run_dir)
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
    finally:
        os.close(fd)
