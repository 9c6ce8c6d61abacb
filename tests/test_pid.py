"""lmprof.pid: the cached process id follows a fork, as os.getpid() does (the session's 'is this my
process?' check in every step relies on it: a DataLoader worker must not act as the session)."""
from __future__ import annotations

import multiprocessing
import os

import pytest

from lmprof.pid import this_pid


def _report(q: "multiprocessing.Queue[tuple[int, int]]") -> None:
    q.put((this_pid(), os.getpid()))


def test_this_pid_is_the_process_id_here_and_in_a_forked_child() -> None:
    assert this_pid() == os.getpid()
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # the child: write what it sees, leave without running the test session's exit handlers
        os.write(w, f"{this_pid()} {os.getpid()}".encode())
        os._exit(0)
    os.close(w)
    seen, real = map(int, os.read(r, 64).split())
    os.waitpid(child, 0)
    assert seen == real == child != os.getpid()


def test_a_multiprocessing_fork_child_sees_its_own_id() -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q,))
    p.start()
    seen, real = q.get(timeout=30)
    p.join(30)
    assert seen == real == p.pid != os.getpid()
