"""Start each sweep worker as a fresh process forked from a server that has imported torch once.

A point still runs in a process of its own, started for it and ended with it: a crash, an
out-of-memory kill or a timeout ends that point only, and nothing a point leaves behind (tensors,
allocator caches, compiled graphs, threads, a changed global) reaches the next one. What points
share is the *imports*: multiprocessing's fork server (started at the first point) imports torch,
dynamo (every torch optimizer imports it) and lmprof's pipeline once, without running a single
torch op, so no thread pool or device is initialised in it; each worker is a fork of that server,
an interpreter with those modules already imported instead of a new one that imports them again
(seconds a point).

The worker then becomes what ``python -m lmprof.sweep.worker`` would be (see
:func:`lmprof.sweep.worker.forked_main`): its own session and process group (a timeout kills it and
anything it started), the runner's environment as it is now (not the server's from when it
started), stdin from /dev/null, stdout and stderr into the point's ``worker.log``.

Settings torch reads once, when it is imported (``TORCH_CPP_LOG_LEVEL``, ``TORCH_LOGS``, ...), are
the ones the sweep's process had when the server started. Like any multiprocessing start method but
fork, the server imports the main module of the process that starts it (a script calling
``run_sweep`` needs the usual ``if __name__ == "__main__":`` guard); ``start="subprocess"`` avoids
the server altogether.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

# Imported once in the server: what every worker would otherwise import for itself (torch, dynamo and
# lmprof's pipeline, then frozen: see the module).
PRELOAD = ["lmprof.sweep.server_imports"]
_context: BaseContext | None = None


def available() -> bool:
    """Whether this platform has multiprocessing's fork server (POSIX)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def _server() -> BaseContext:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        # Only takes effect if no fork server runs yet in this process (else its own list stands).
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


class ForkedWorker:
    """One worker forked from the server; has what the runner uses of a ``subprocess.Popen``."""

    def __init__(self, point_json: Path, run_dir: Path, log: Path):
        from lmprof.sweep import worker

        self._proc: Any = _server().Process(  # type: ignore[attr-defined]  # contexts have Process at run time
            target=worker.forked_main, args=(str(point_json), str(run_dir), str(log), dict(os.environ)),
            name=f"lmprof-sweep-{run_dir.name}")
        self._proc.start()

    @property
    def pid(self) -> int:
        """The worker's process id (also its process group's, once it has started its session)."""
        return int(self._proc.pid)

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: the signal that ended it); ``subprocess.TimeoutExpired`` if it
        is still running after ``timeout`` seconds."""
        self._proc.join(timeout)
        code = self._proc.exitcode
        if code is None:
            raise subprocess.TimeoutExpired("lmprof.sweep.worker", timeout or 0.0)
        return int(code)
