"""Run one sweep point in its own process: ``python -m lmprof.sweep.worker <point.json> <run_dir>``.

The runner starts one worker per point so that a crash, an out-of-memory or a hang ends that point
only. The worker reads the :class:`~lmprof.sweep.spec.Point`, runs ``run_training`` or
``run_inference`` with ``out_dir=<run_dir>`` (a script sweep's point runs its ``lmprof run``
subprocess instead: :mod:`lmprof.sweep.script`) and exits with:

* ``0`` — the run record was written to ``<run_dir>``;
* ``3`` (:data:`EXIT_OOM`) — out of memory (``torch.OutOfMemoryError``, ``MemoryError``, or an error
  whose message says "out of memory");
* ``1`` (:data:`EXIT_ERROR`) — any other failure.

Its last output line is ``lmprof.sweep: <one-line reason>`` (:data:`RESULT_PREFIX`); the runner keeps
that line as the point's message, and the traceback, if any, stays in ``worker.log``.

Testing hook: ``LMPROF_SWEEP_FAKE_OOM=<id>[,<id>...]`` (or ``*`` for every point) makes the worker
raise ``torch.OutOfMemoryError`` for those point ids after the model libraries are imported, so tests
can check how a sweep records an OOM without exhausting memory.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from lmprof.errors import is_oom

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_OOM = 3
EXIT_ORPHANED = 70
RESULT_PREFIX = "lmprof.sweep: "
# The runner's pid, set by the runner for each worker it starts (see _exit_with_parent).
RUNNER_PID_ENV = "LMPROF_SWEEP_RUNNER_PID"
FAKE_OOM_ENV = "LMPROF_SWEEP_FAKE_OOM"
THREADS_ENV = "LMPROF_SWEEP_THREADS"  # the point's thread count, where its executor sets one (Ray)


def one_line(exc: BaseException) -> str:
    """The exception as one line: lmprof's own errors as their message, others with their type."""
    from lmprof.errors import LmprofError

    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    if isinstance(exc, LmprofError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _runner_pid() -> int:
    """The pid of the runner that started this worker: what it put in :data:`RUNNER_PID_ENV`, else the
    parent now (a worker started by hand)."""
    text = os.environ.get(RUNNER_PID_ENV, "")
    return int(text) if text.isdigit() else os.getppid()


_FORK_SERVER: int | None = None  # a worker forked from the sweep's fork server: that server's pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphaned(runner: int) -> bool:
    """Whether the runner is gone. A worker the runner started has it as its parent; a forked one has
    the fork server (the runner's child, which ends with it) as its parent, and checks the runner too."""
    parent = os.getppid()
    if parent == runner:
        return False
    return not (_FORK_SERVER is not None and parent == _FORK_SERVER and _alive(runner))


def _leave_if_orphaned(runner: int) -> None:
    if _orphaned(runner):
        print(f"{RESULT_PREFIX}the sweep that started this worker (pid {runner}) is gone; leaving", flush=True)
        if hasattr(os, "killpg") and os.getpgrp() == os.getpid():
            # Leading its own group (as the runner starts it): take what it started along (a script
            # point's `lmprof run`, compiler workers), this process included.
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(EXIT_ORPHANED)


def _exit_with_parent(runner: int) -> None:
    """Leave when the runner dies (e.g. SIGKILL), so an orphan never keeps writing into the sweep.

    The runner's pid comes from the runner (:data:`RUNNER_PID_ENV`), not from ``os.getppid()`` here: a
    runner killed while this process was still starting up has already handed it to the reaper, and a
    worker that took the reaper for its runner would run its whole point unwatched — holding the point's
    lock, so a resumed sweep timed out waiting for it, or writing the folder after a new worker's run.
    """
    _leave_if_orphaned(runner)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            _leave_if_orphaned(runner)

    threading.Thread(target=watch, name="lmprof-sweep-parent-watch", daemon=True).start()


def _fake_oom(point_id: str) -> None:
    wanted = {s.strip() for s in os.environ.get(FAKE_OOM_ENV, "").split(",") if s.strip()}
    if point_id in wanted or "*" in wanted:
        import torch

        oom = getattr(torch, "OutOfMemoryError", MemoryError)
        raise oom(f"out of memory (simulated by {FAKE_OOM_ENV} for point {point_id})")


def _set_threads() -> None:
    """The thread count an executor gave the point (``THREADS_ENV``, the Ray executor's CPU share): a
    worker forked from the sweep's server has torch's thread pool sized when the server imported it."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if text.isdigit() and int(text) > 0:
        import torch

        torch.set_num_threads(int(text))


def run_point(point_json: Path, run_dir: Path) -> None:
    """Validate the point into a run config and run it, writing the run record into ``run_dir``."""
    from lmprof.config import TrainConfig, build
    from lmprof.modes import traits
    from lmprof.sweep.script import ScriptPoint, run_script_point
    from lmprof.sweep.spec import parse_point

    _set_threads()
    point = parse_point(point_json.read_text())
    if isinstance(point, ScriptPoint):  # the user's script, under its own `lmprof run` (sweep/script.py)
        _fake_oom(point.id)
        run_script_point(point, run_dir)
        return
    values = point.run_values(out=str(run_dir.parent))
    values.setdefault("plots", False)  # the sweep draws its own plots from the store
    if traits(point.mode).trains:
        from lmprof.pipeline.train import run_training

        _fake_oom(point.id)
        run_training(build(TrainConfig, values), out_dir=run_dir)
    else:
        from lmprof.config import InferConfig
        from lmprof.pipeline.infer import run_inference

        _fake_oom(point.id)
        run_inference(build(InferConfig, values), out_dir=run_dir)


def forked_main(point_json: str, run_dir: str, log: str, env: dict[str, str]) -> None:
    """Entry point of a worker forked from the sweep's fork server (sweep/forked.py): first become
    what ``python -m lmprof.sweep.worker`` started by the runner would be, then run :func:`main`."""
    global _FORK_SERVER
    _FORK_SERVER = os.getppid()
    if hasattr(os, "setsid"):
        os.setsid()  # a process group of its own, which a timeout kills whole
    os.environ.clear()
    os.environ.update(env)  # the runner's environment now, not the server's from when it started
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.exit(main([point_json, run_dir]))


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code (see the module docstring)."""
    if len(argv) != 2:
        print(f"{RESULT_PREFIX}usage: python -m lmprof.sweep.worker <point.json> <run_dir>", flush=True)
        return EXIT_ERROR
    runner = _runner_pid()
    _exit_with_parent(runner)
    from lmprof.measure.native_logs import quiet_process

    quiet_process()  # kineto's profiler_start/stop lines would fill worker.log (a no-op once torch is imported)
    from lmprof.sweep.lock import hold_point_lock

    hold_point_lock(Path(argv[1]))  # held until this process ends: the runner never empties a live folder
    # The wait for the lock may have outlived the runner: an orphan must not write the folder even once.
    _leave_if_orphaned(runner)
    try:
        run_point(Path(argv[0]), Path(argv[1]))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a status, never a hang
        from lmprof.errors import LmprofError

        if not isinstance(exc, LmprofError):
            traceback.print_exc()
        sys.stderr.flush()
        print(f"{RESULT_PREFIX}{one_line(exc)}", flush=True)
        return EXIT_OOM if is_oom(exc) else EXIT_ERROR
    print(f"{RESULT_PREFIX}ok", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    from lmprof import gc_hold

    gc_hold.hold()  # a process of lmprof's own: released when the run's session starts (lmprof/gc_hold.py)
    sys.exit(main(sys.argv[1:]))
