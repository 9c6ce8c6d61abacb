"""Run a sweep: each point in its own worker process, each result committed as soon as it is known.

Isolation is the point of this module: a point that crashes, runs out of memory or hangs is killed
and recorded with its status (``ok``, ``oom``, ``timeout``, ``error``) and a one-line reason, and the
sweep goes on with the next point. Points run one at a time, so runs never compete for the device.
"""
from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator, Protocol

from lmprof import gc_hold
from lmprof.atomic import write_text
from lmprof.errors import OOM_TEXT, ConfigError
from lmprof.outdir import check_output_dir
from lmprof.record.run import Run
from lmprof.record.store import DB_NAME, FAILED, Store
from lmprof.sweep import forked, worker
from lmprof.sweep.lock import sweep_lock, wait_point_free
from lmprof.sweep.plan import Plan
from lmprof.sweep.spec import AnyPoint, AnySpec

RUNS_DIR = "runs"
FORKSERVER = "forkserver"  # each worker forked from a server with torch imported (sweep/forked.py)
SUBPROCESS = "subprocess"  # each worker a new `python -m lmprof.sweep.worker`
START_ENV = "LMPROF_SWEEP_START"  # forkserver (default) or subprocess
_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    """How one point ended."""

    status: str  # ok, oom, timeout, error
    message: str | None
    started: str
    finished: str
    duration_s: float


@dataclass
class SweepSummary:
    """Counts over the points of one ``run_sweep`` call."""

    total: int
    skipped_ok: int = 0
    skipped_failed: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    interrupted: bool = False

    @property
    def failed(self) -> int:
        return sum(self.counts.get(s, 0) for s in FAILED)


class SweepListener(Protocol):
    """What the runner reports while it works (the CLI draws a progress bar from it)."""

    def begin(self, total: int, todo: int, skipped_ok: int) -> None: ...
    def point_started(self, point: AnyPoint, index: int) -> None: ...
    def point_finished(self, point: AnyPoint, outcome: Outcome, headline: str) -> None: ...
    def end(self, summary: SweepSummary) -> None: ...


class QuietListener:
    """A listener that reports nothing (the default for library use)."""

    def begin(self, total: int, todo: int, skipped_ok: int) -> None:
        pass

    def point_started(self, point: AnyPoint, index: int) -> None:
        pass

    def point_finished(self, point: AnyPoint, outcome: Outcome, headline: str) -> None:
        pass

    def end(self, summary: SweepSummary) -> None:
        pass


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _Worker(Protocol):
    """What the runner uses of a worker process: a Popen, or a worker forked from the fork server."""

    @property
    def pid(self) -> int: ...
    def wait(self, timeout: float | None = None) -> int: ...


def _kill_group(proc: _Worker) -> None:
    """Kill the worker and anything it started (torch.compile spawns compiler processes)."""
    try:
        if hasattr(os, "killpg"):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # a forked worker killed before it made its own group
                os.kill(proc.pid, signal.SIGKILL)
        else:  # Windows: no process groups here, kill the worker itself
            os.kill(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path) -> list[str]:
    if not path.is_file():
        return []
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
        return fh.read().decode("utf-8", "replace").splitlines()


def classify(returncode: int, log_lines: list[str], has_record: bool) -> tuple[str, str | None]:
    """Status and one-line message from the worker's exit code and the tail of its output."""
    reported = [ln[len(worker.RESULT_PREFIX):].strip() for ln in log_lines if ln.startswith(worker.RESULT_PREFIX)]
    lines = [ln.strip() for ln in log_lines if ln.strip()]
    last = reported[-1] if reported else (lines[-1] if lines else None)
    if returncode == worker.EXIT_OK:
        return ("ok", None) if has_record else ("error", "the worker exited without writing a run record")
    if returncode == worker.EXIT_OOM:
        return "oom", last or "out of memory"
    if returncode == -getattr(signal, "SIGKILL", 9):
        return "oom", "killed by signal 9 (SIGKILL): most likely the system's out-of-memory killer"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "error", f"the worker died from {name}" + (f" ({last})" if last else "")
    if any(OOM_TEXT.search(ln) for ln in lines[-50:]):
        oom_line = next(ln for ln in reversed(lines) if OOM_TEXT.search(ln))
        return "oom", oom_line[:300]
    return "error", (last or f"the worker exited with code {returncode}")[:300]


def _clear_run_dir(run_dir: Path) -> None:
    """Empty a point's folder for a fresh run. A symlink (or any non-folder) put in its place is
    unlinked, never followed: rmtree through a link would delete whatever it points at, and
    refuses to, which used to fail every --resume."""
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        run_dir.unlink()
    elif run_dir.exists():
        shutil.rmtree(run_dir)


def start_worker(point_json: Path, run_dir: Path, log: IO[bytes], python: str = sys.executable) -> subprocess.Popen[bytes]:
    """Start the worker process of one point, its output into ``log``.

    It is told this process's pid, so that it leaves if this process dies, even before it has started.
    A new session puts the worker and its children in one process group we can kill together.
    """
    return subprocess.Popen(
        [python, "-m", "lmprof.sweep.worker", str(point_json), str(run_dir)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=hasattr(os, "setsid"), env={**os.environ, worker.RUNNER_PID_ENV: str(os.getpid())},
    )


def run_point(point: AnyPoint, run_dir: Path, timeout_s: float, python: str = sys.executable,
              start: str = SUBPROCESS) -> Outcome:
    """Run one point in a worker process, killed after ``timeout_s``; never raises for the point's failure.

    The run folder is emptied first (a point re-run on resume starts clean), but never while a worker
    still holds it (one orphaned by a killed sweep); the worker's output goes to ``<run_dir>/worker.log``.
    ``start``: ``subprocess`` starts ``python -m lmprof.sweep.worker``; ``forkserver`` forks the worker
    from a server that has imported torch once (sweep/forked.py), where the platform has one and
    ``python`` is this interpreter.
    """
    if not wait_point_free(run_dir):
        now = _now()
        return Outcome("error", f"{run_dir} is still being written by a worker of an earlier sweep; "
                       "run again with --resume once it has exited", now, now, 0.0)
    _clear_run_dir(run_dir)
    run_dir.mkdir(parents=True)
    point_json = run_dir / "point.json"
    write_text(point_json, point.model_dump_json(indent=2))
    log = run_dir / "worker.log"
    started, t0 = _now(), time.monotonic()
    with log.open("wb") as fh:
        proc: _Worker
        if start == FORKSERVER and python == sys.executable and forked.available():
            # The runner's pid travels in the environment the forked worker takes on (it is the fork
            # server's child, so its parent is not the runner).
            os.environ[worker.RUNNER_PID_ENV] = str(os.getpid())
            proc = forked.ForkedWorker(point_json, run_dir, log)  # appends to the log just emptied
        else:
            proc = start_worker(point_json, run_dir, fh, python)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except BaseException:
            _kill_group(proc)  # interrupted (Ctrl-C, SIGTERM): never leave the worker behind
            raise
    has_record = (run_dir / "run.json").is_file()
    message: str | None
    if rc is None:
        status, message = "timeout", f"no result after {timeout_s:g} s (timeout_s): the worker was killed"
    else:
        status, message = classify(rc, _tail(log), has_record)
    if status != "ok" and has_record:
        # a script's run is written as its profiled window completes: what failed came after a whole
        # measurement (run.json is written atomically), which a --resume would otherwise throw away
        status, message = "ok", f"measured whole (run.json written as the profiled window completed); then {message}"
    return Outcome(status, message, started, _now(), time.monotonic() - t0)


class Executor(Protocol):
    """Where sweep points run. ``run`` yields (point, outcome) as each finishes, in any order."""

    def run(
        self, jobs: list[tuple[AnyPoint, Path]], timeout_s: float, python: str, on_start: Callable[[AnyPoint], None]
    ) -> Iterator[tuple[AnyPoint, Outcome]]: ...


class LocalExecutor:
    """One point after another on this machine, each in its own worker process (by default forked
    from a server that has imported torch once: sweep/forked.py)."""

    def __init__(self, start: str | None = None):
        start = start or os.environ.get(START_ENV, "").strip() or FORKSERVER
        if start not in (FORKSERVER, SUBPROCESS):
            raise ConfigError(f"{START_ENV}: use {FORKSERVER} or {SUBPROCESS}, not {start!r}")
        self.start = start

    def run(
        self, jobs: list[tuple[AnyPoint, Path]], timeout_s: float, python: str, on_start: Callable[[AnyPoint], None]
    ) -> Iterator[tuple[AnyPoint, Outcome]]:
        for point, run_dir in jobs:
            on_start(point)
            yield point, run_point(point, run_dir, timeout_s, python, self.start)


def headline(run: Run) -> str:
    """The figure shown beside a finished point: tokens/s for training, decode tokens/s for inference."""
    from lmprof.show.format import metric_value

    from lmprof.record.catalogue import headlines

    for spec in headlines():
        m = run.metrics.get(spec.name)
        if m is not None and m.value is not None:
            return f"{spec.name} {metric_value(m)}"
    return ""


def run_sweep(
    spec: AnySpec,
    out: str | Path,
    *,
    resume: bool = False,
    retry_failed: bool = True,
    listener: SweepListener | None = None,
    python: str = sys.executable,
    executor: "Executor | None" = None,
) -> SweepSummary:
    """Run every point of ``spec`` into the sweep folder ``out``; returns the counts.

    Without ``resume`` a folder that already holds results is refused (ConfigError). With it, points
    recorded ``ok`` are never run again; failed points (``oom``, ``timeout``, ``error``) are run again
    unless ``retry_failed`` is False; points left ``running`` or ``pending`` by an interrupted sweep
    are run. ``executor`` decides where points run (default: here, one after another); whatever it
    is, each finished point is committed to the store on this process as soon as it returns.
    """
    out = Path(out)
    check_output_dir(out, "--out")
    # a sweep can run for hours: its runner collects garbage as any process does (lmprof/gc_hold.py)
    gc_hold.release()
    listener = listener or QuietListener()
    executor = executor or LocalExecutor()  # an unknown LMPROF_SWEEP_START is said before anything runs
    plan = spec.expand()
    with sweep_lock(out):  # one writer per store: a second sweep on this folder stops here
        return _run_locked(spec, plan, out, resume, retry_failed, listener, python, executor)


def _run_locked(spec: AnySpec, plan: Plan[AnyPoint], out: Path, resume: bool, retry_failed: bool,
                listener: SweepListener, python: str, executor: "Executor | None") -> SweepSummary:
    from lmprof.record.run import Run

    db = out / DB_NAME
    if db.exists() and not resume:
        with Store(db) as probe:
            if probe.count_points():
                raise ConfigError(
                    f"{out} already holds sweep results ({DB_NAME}): pass --resume to continue that sweep, "
                    f"or choose a new --out folder")
    summary = SweepSummary(total=len(plan.points))
    t_start = time.monotonic()
    with Store(db) as store:
        store.plan(plan.points, spec.model_dump_json())
        known = store.statuses()
        todo: list[AnyPoint] = []
        for p in plan.points:
            status = known.get(p.id, "pending")
            if status == "ok":
                summary.skipped_ok += 1
            elif status in FAILED and not retry_failed:
                summary.skipped_failed += 1
            else:
                todo.append(p)
        listener.begin(len(plan.points), len(todo), summary.skipped_ok)
        executor = executor or LocalExecutor()
        started = {p.id: i for i, p in enumerate(todo)}

        def on_start(point: AnyPoint) -> None:
            store.mark_running(point.id, f"{RUNS_DIR}/{point.id}", _now())
            listener.point_started(point, started[point.id])

        jobs = [(p, out / RUNS_DIR / p.id) for p in todo]
        finished: set[str] = set()
        try:
            for point, outcome in executor.run(jobs, spec.timeout_s, python, on_start):
                finished.add(point.id)
                run = None
                run_dir = out / RUNS_DIR / point.id
                if outcome.status == "ok":
                    try:
                        run = Run.load(run_dir)
                    except Exception as exc:  # a record we cannot read is this point's error, not the sweep's
                        outcome = Outcome("error", f"unreadable run record: {exc}", outcome.started, outcome.finished,
                                          outcome.duration_s)
                store.finish(point.id, outcome.status, outcome.message, outcome.finished, outcome.duration_s, run)
                summary.counts[outcome.status] = summary.counts.get(outcome.status, 0) + 1
                listener.point_finished(point, outcome, headline(run) if run is not None else "")
        except BaseException:
            for point, _ in jobs:
                if point.id not in finished and store.statuses().get(point.id) == "running":
                    store.mark_pending(point.id, "interrupted while running; run again with --resume")
            summary.interrupted = True
            summary.duration_s = time.monotonic() - t_start
            listener.end(summary)
            raise
    summary.duration_s = time.monotonic() - t_start
    listener.end(summary)
    return summary
