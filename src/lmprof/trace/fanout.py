"""Many trace files (hundreds of ranks) analysed with memory bounded by one trace per worker.

:func:`analyze_path` is the door of ``lmprof analyze``: a file or a folder of them in, one combined
report out (analyze.py analyses one table and combines the reports; this module only schedules).

Each file is loaded, reduced to its report (:class:`~lmprof.trace.analyze.TraceReport`, kilobytes)
and, with ``--export``, its Parquet partition (the Arrow tables of :mod:`lmprof.trace.export`),
then freed before the worker takes the next file. The driver keeps the reports, appends each
partition to the Parquet files as it arrives (in file order, so the files are the same whoever
made them) and drops it; it never holds a loaded trace, so its memory does not grow with the
number of files: the reports' few kilobytes each, and at most a few partitions in flight per
worker.

Where the work runs:

* in this process, one file after another: one file, few or small files, or ``workers=1``;
* in local worker processes (the default for folders of at least :data:`PARALLEL_MIN_BYTES` of
  traces, or ``workers=N``): forked from this process when it runs no other thread, else started
  by a fork server (see :func:`_start_method`);
* on Ray (``ray="local"`` starts a Ray on this machine, an address joins a cluster: ``"auto"``,
  ``"ray://host:10001"``): one task per file. Every node must read the files at the same path (a
  shared filesystem), as Ray sweeps write their run folders.

The report is the same whichever runs it: reports are combined in file order by the same function.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmprof.errors import DataError, LmprofError
from lmprof.ray_session import ray_session
from lmprof.trace.analyze import Report, analyze_table, combine, find_traces, load_tables
from lmprof.trace.blocks import BlockMap

PARALLEL_MIN_BYTES = 16 << 20  # smaller folders are analysed in-process: starting workers costs more
MAX_WORKERS = 8
_IN_FLIGHT_PER_WORKER = 2  # files queued per worker: keeps workers busy, bounds the results held
_WORKERS_ENV = "LMPROF_ANALYZE_WORKERS"


@dataclass(frozen=True)
class Job:
    """What every worker does with a file (picklable: it travels to worker processes and Ray tasks)."""

    top: int = 10
    include_last_step: bool = False
    blocks: BlockMap | None = None
    export: bool = False


Result = tuple[Any, dict[str, Any] | None]  # (TraceReport, the partition's Arrow tables or None)


def analyze_one(path: str, job: Job) -> list[Result]:
    """Load and analyse one file: its reports (one per table: an Nsight Systems export may hold
    several processes) and, when exporting, each one's Arrow tables with rank 0 (the driver sets it)."""
    from lmprof.trace.timeline import select_device

    out: list[Result] = []
    tables = load_tables(path)
    while tables:
        table = tables.pop(0)  # freed as soon as it is reduced
        rep = analyze_table(table, top=job.top, include_last_step=job.include_last_step, blocks=job.blocks)
        part = None
        if job.export:
            from lmprof.trace.export import analysis_tables, trace_tables

            sel = select_device(table, job.include_last_step)
            comm = rep.device.communication if rep.device is not None else None
            part = {**trace_tables(table, 0, sel.rows if sel else None),
                    **analysis_tables(0, comm, rep.critical_path)}
        del table
        out.append((rep, part))
    return out


def pool_size(files: list[Path], workers: int | None = None) -> int:
    """Worker processes for ``files``: ``workers`` (else ``$LMPROF_ANALYZE_WORKERS``) when given, else
    1 for one file or less than :data:`PARALLEL_MIN_BYTES` of them, else the usable cores (at most
    :data:`MAX_WORKERS`); never more than the files."""
    if workers is None:
        env = os.environ.get(_WORKERS_ENV, "").strip()
        workers = int(env) if env.isdigit() else None
    if workers is not None:
        return max(1, min(workers, len(files)))
    if len(files) < 2:
        return 1
    size = 0
    for f in files:
        try:
            size += f.stat().st_size
        except OSError:
            pass
    if size < PARALLEL_MIN_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_WORKERS, len(files)))


def analyze_files(
    files: list[Path],
    *,
    top: int = 10,
    include_last_step: bool = False,
    blocks: BlockMap | None = None,
    exporter: Any = None,
    workers: int | None = None,
    ray: str | None = None,
    ray_init: dict[str, Any] | None = None,
) -> list[Any]:
    """The reports of ``files`` in file order (see the module docstring); each partition is added to
    ``exporter`` (:class:`lmprof.trace.export.Exporter`) as it arrives, ranked like the reports:
    its ``distributedInfo`` rank, else its position. ``ray_init``: extra arguments to ``ray.init``."""
    job = Job(top, include_last_step, blocks, exporter is not None)
    if ray is not None:
        results = _on_ray(files, job, ray, ray_init or {})
    else:
        n = pool_size(files, workers)
        if n > 1 and _start_method() != "fork" and not _main_importable():
            n = 1  # the workers could not start: analyse here, one file after another
        results = (analyze_one(str(f), job) for f in files) if n <= 1 else _in_processes(files, job, n)
    reports: list[Any] = []
    for per_file in results:
        for rep, part in per_file:
            if exporter is not None and part is not None:
                exporter.add_tables(_ranked(part, rep.rank if rep.rank is not None else len(reports)))
            reports.append(rep)
        del per_file
    return reports


def _ranked(part: dict[str, Any], rank: int) -> dict[str, Any]:
    """The partition's tables with their ``rank`` column set."""
    import numpy as np
    import pyarrow as pa

    out = {}
    for name, t in part.items():
        i = t.schema.get_field_index("rank")
        out[name] = t.set_column(i, "rank", pa.array(np.full(t.num_rows, rank, dtype=np.int32)))
    return out


def _worker_start() -> None:
    # each worker decodes its file in one thread: the processes already use the cores
    os.environ.setdefault("LMPROF_TRACE_WORKERS", "1")


def _start_method() -> str:
    """``fork`` when this process runs no other thread (a fork copies only the calling thread, so a
    lock another thread held would stay locked in the child): the workers start at once with what
    is imported here. Otherwise a fork server (a fresh process that forks the workers), which
    imports the main module again (a script calling this needs ``if __name__ == "__main__":``)."""
    import multiprocessing
    import threading

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _main_importable() -> bool:
    """Whether a fork server or a spawned worker can import this process's main module again (a
    program read from standard input cannot)."""
    import sys

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is None or os.path.isfile(path)


def _in_processes(files: list[Path], job: Job, n: int) -> Iterator[list[Result]]:
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context(_start_method())
    if ctx.get_start_method() == "forkserver":  # what every worker imports, once in the server (if none runs yet)
        ctx.set_forkserver_preload(["lmprof.trace.analyze"] + (["lmprof.trace.export", "pandas", "pyarrow.parquet"]
                                                               if job.export else []))
    pending: deque[tuple[Path, Future[list[Result]]]] = deque()
    todo = deque(files)
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_start) as pool:
        try:
            while todo or pending:
                while todo and len(pending) < n * _IN_FLIGHT_PER_WORKER:
                    f = todo.popleft()
                    pending.append((f, pool.submit(analyze_one, str(f), job)))
                f, fut = pending.popleft()
                try:
                    yield fut.result()
                except BrokenProcessPool:
                    raise DataError(f"a worker process died while analysing {f} (out of memory?): "
                                    "try fewer workers (--workers)") from None
        finally:
            for _, fut in pending:
                fut.cancel()


def _on_ray(files: list[Path], job: Job, address: str, init: dict[str, Any]) -> Iterator[list[Result]]:
    with ray_session(None if address == "local" else address, init, "--ray") as ray:
        remote = ray.remote(num_cpus=1)(analyze_one)
        slots = max(1, int(ray.cluster_resources().get("CPU", 1))) * _IN_FLIGHT_PER_WORKER
        pending: deque[tuple[Path, Any]] = deque()
        todo = deque(files)
        try:
            while todo or pending:
                while todo and len(pending) < slots:
                    f = todo.popleft()
                    pending.append((f, remote.remote(str(f), job)))
                f, ref = pending.popleft()
                try:
                    got = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a task's own error comes back wrapped
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, LmprofError):
                        raise cause from None
                    raise DataError(f"the Ray task analysing {f} failed: {str(exc).splitlines()[0][:200]}") from None
                del ref
                yield got
        finally:
            for _, ref in pending:
                ray.cancel(ref, force=True)


def analyze_path(
    path: str | Path,
    *,
    top: int = 10,
    include_last_step: bool = False,
    export: str | Path | None = None,
    blocks: BlockMap | None = None,
    workers: int | None = None,
    ray: str | None = None,
) -> Report:
    """Load and analyse the trace(s) at ``path``, one at a time per worker, so that only one table
    per worker is in memory (:func:`analyze_files`: in this process, in local processes by default for
    large folders, ``workers`` to choose, or on Ray with ``ray`` set to an address or ``"local"``). The report is the same whichever runs it.

    ``export``: a folder to write the SQL-ready Parquet tables to (:mod:`lmprof.trace.export`);
    it is checked before any trace is read, and the files appear only when every trace succeeded.
    """
    notes: list[str] = []
    files = find_traces(path, notes)
    exporter = None
    if export is not None:
        from lmprof.trace.export import Exporter

        exporter = Exporter(Path(export))
    ok = False
    try:
        reports = analyze_files(files, top=top, include_last_step=include_last_step, blocks=blocks,
                                exporter=exporter, workers=workers, ray=ray)
        report = combine(reports)
        ok = True
    finally:
        if exporter is not None:
            exporter.close(ok)
    report.notes[:0] = notes
    return report
