"""This process's id, kept current by a fork handler rather than asked of the kernel at each call.

The session and the watch ask "am I still the process that started?" several times in every step of
the user's loop (a forked child, such as a DataLoader worker, must do nothing). ``os.getpid()`` is a
system call: about 5 µs when it runs right after a training step, with the caches cold, and it ran
five times a step. Children made by ``os.fork`` (multiprocessing, DataLoader workers) run the handler;
code that must be sure outside the loop (ending a run, writing its folder) still asks the kernel.
"""
from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def this_pid() -> int:
    """The id of the process running now (as ``os.getpid()``)."""
    return _pid
