"""Load a Kineto / Chrome trace (JSON, plain or gzipped) into a :class:`~lmprof.trace.table.TraceTable`.

How it stays fast and lean: the file is read (and gunzipped) in bounded chunks and never held whole.
Each chunk is cut after its last complete event (see :class:`lmprof.trace.kineto.split.Splitter`),
and that run of events becomes numpy columns before the next chunk is read: by the compiled reader
(:mod:`lmprof.trace.kineto.scan`) when every event in it is plain, else by msgspec into small typed
structs (:mod:`lmprof.trace.kineto.decode`, the rule both follow). Large files are decoded by worker
threads (the compiled reader runs without the GIL) or processes (msgspec). So the peak extra memory
is about the final columns plus a few chunks' worth of transient data.
"""
from __future__ import annotations

import os
import sys
from collections import deque
from pathlib import Path
from typing import Any, Callable

import msgspec

from lmprof.errors import DataError
from lmprof.trace.kineto import heap, scan
from lmprof.trace.kineto.columns import Merger, frames, memory_frame
from lmprof.trace.kineto.decode import DECODE_ERRORS, Chunk, describe
from lmprof.trace.read import gzip_size, open_stream
from lmprof.trace.kineto.scan import read_chunk
from lmprof.trace.kineto.split import Splitter
from lmprof.trace.table import TraceTable, parse_rank

__all__ = ["decode_workers", "load_trace"]

class _Meta(msgspec.Struct):
    # Any: odd metadata must never make a trace unreadable
    traceEvents: list[Any] = []
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    traceName: Any = None


_META_DECODER = msgspec.json.Decoder(_Meta)
_LIST_META_DECODER = msgspec.json.Decoder(list[Any])


# --------------------------------------------------------------------------------------------- load


def load_trace(path: str | Path, workers: int | None = None, *, flows: bool = True) -> TraceTable:
    """Parse a trace file into a :class:`TraceTable`, or raise DataError naming the problem.

    A trace that can mostly be read is loaded and ``TraceTable.notes`` says what was skipped or
    repaired (unreadable events, invalid UTF-8, out-of-range integers or times, unreadable
    top-level fields). One where most events cannot be read is a DataError.

    ``workers``: processes that decode chunks of a large file in parallel (default: see
    :func:`decode_workers`); the table is the same whatever the number.

    ``flows=False``: the flow events (``ph`` s/t/f) are read but not kept, and ``flow_cols`` is
    empty. No analysis reads them (kernels are linked to their launches by correlation id), so
    ``lmprof analyze`` leaves them out: 17 MB less on the 259 MB benchmark trace.
    """
    p = Path(path)
    size = _json_size(p)
    n = decode_workers(p, workers, size)
    decoded = _decode_parallel(p, n, size, flows) if n > 1 else None  # None also when a guessed cut was wrong
    if decoded is None:
        merged = Merger(size, flows)
        decoded = merged, _split(p, lambda view, exact: merged.add(read_chunk(view, exact)))
    table = _table(p, *decoded)
    del decoded
    heap.after_load()
    return table


# Files below this size are decoded in-process: starting workers costs more than it saves.
PARALLEL_MIN_BYTES = 64 << 20
_IN_FLIGHT_PER_WORKER = 4  # chunks queued per worker: bounds memory, keeps workers busy (2 left them idle)


def decode_workers(path: Path, requested: int | None = None, size: int | None = None) -> int:
    """How many threads (compiled reader) or processes (msgspec) decode ``path``: 1 for small files
    (by their decompressed size when gzipped), else the usable cores (at most 4).

    ``requested`` (``load_trace(workers=...)``), else ``LMPROF_TRACE_WORKERS``, overrides the size
    rule (1 turns parallel decoding off). Without the compiled reader, parallel decoding needs the
    ``fork`` start method (Linux); elsewhere chunks are then always decoded in-process. ``size``:
    the JSON's size when the caller has it already (see :func:`_json_size`).
    """
    if sys.platform != "linux" and not scan.NATIVE:
        return 1
    if requested is not None:
        return max(1, requested)
    env = os.environ.get("LMPROF_TRACE_WORKERS", "").strip()
    if env.isdigit():
        return max(1, int(env))
    if size is None:
        size = _json_size(path)
    if size < PARALLEL_MIN_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 4))


class _Rollback(Exception):
    """A guessed cut decoded badly in a worker: the order-dependent fallback must run instead."""


def _json_size(p: Path) -> int:
    """About how many bytes of JSON ``p`` holds: a gzip file's trailer records it (modulo 4 GiB,
    hence never less than the file), else the file's size; 0 when it cannot be told."""
    try:
        return max(p.stat().st_size, gzip_size(p))
    except (OSError, DataError):
        return 0


def _decode_parallel(p: Path, workers: int, size: int = 0, flows: bool = True) -> tuple[Merger, bytes] | None:
    """Decode chunks in worker threads (with the compiled reader) or processes, merged in file
    order, and the top-level JSON without its events; None when a guessed cut was wrong.

    Threads when the compiled reader is built: it scans without holding the GIL, and threads need
    no copy of each chunk's columns back through a pipe. Processes otherwise (msgspec holds the GIL).
    The splitter's cheap guesses are checked by decoding them; in-process a bad guess is repaired
    on the spot, but here its chunk is already out with a worker, so the whole load is redone
    in-process (rare: it needs ``}, {`` inside a string right where a read ends). A worker that dies
    (killed for memory, ...) also makes the load run again in-process.
    """
    from concurrent.futures import Executor, Future, ThreadPoolExecutor

    merged = Merger(size, flows)
    pending: deque[tuple[Future[Chunk], bool]] = deque()

    def collect(item: tuple[Future[Chunk], bool]) -> None:
        fut, exact = item
        try:
            merged.add(fut.result())
        except DECODE_ERRORS:
            if exact:
                raise
            raise _Rollback from None

    pool: Executor
    ends: tuple[type[BaseException], ...] = (_Rollback,)  # a bad guess, or (processes) a worker that died
    if scan.NATIVE:  # read at call time: the one switch read_chunk obeys too
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lmprof-trace")
    else:  # multiprocessing only here: importing it cost every `lmprof analyze` 12 ms
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        ends = (_Rollback, BrokenProcessPool)
    with pool:

        def submit(view: memoryview, exact: bool) -> None:
            # a thread reads the splitter's view as it is (the splitter never writes to it again);
            # a process needs bytes to pickle
            payload = view if scan.NATIVE else bytes(view)
            pending.append((pool.submit(read_chunk, payload, exact), exact))
            while len(pending) > workers * _IN_FLIGHT_PER_WORKER:
                collect(pending.popleft())

        try:
            meta_json = _split(p, submit)
            while pending:
                collect(pending.popleft())
        except ends:
            # a bad guess, or a worker that died (killed for memory, ...): decode in-process instead
            for fut, _ in pending:
                fut.cancel()
            return None
    return merged, meta_json


def _split(p: Path, on_events: Callable[[memoryview, bool], None]) -> bytes:
    """Feed the file through a :class:`Splitter`; returns the top-level JSON without its events."""
    splitter = Splitter(p, on_events, bad_guess=DECODE_ERRORS)
    with open_stream(p) as stream:
        splitter.read_all(stream)
    return splitter.finish()


def _table(p: Path, builder: Merger, meta_json: bytes) -> TraceTable:
    notes: list[str] = []
    top = _Meta()
    try:
        if meta_json[:1] == b"[":
            _LIST_META_DECODER.decode(meta_json)
        else:
            top = _META_DECODER.decode(meta_json)
    except DECODE_ERRORS as exc:
        if builder.n_raw == 0:
            raise DataError(f"{p}: not a valid trace JSON ({describe(exc)})") from None
        notes.append(f"top-level fields outside traceEvents could not be read ({describe(exc)}): ignored")
    _check_skipped(p, builder)
    events, flows, dropped = frames(builder)
    if events.empty:
        what = "no events" if builder.n_raw == 0 else "no complete ('ph': 'X') events"
        raise DataError(f"{p}: trace has {what}")
    notes += _load_notes(builder, dropped)
    meta: dict[str, Any] = {
        "distributedInfo": top.distributedInfo,
        "deviceProperties": top.deviceProperties,
        "baseTimeNanoseconds": top.baseTimeNanoseconds,
        "schemaVersion": top.schemaVersion,
        "traceName": top.traceName,
        "id_codes": {v: k for k, v in builder.id_codes.items()},
    }
    info = top.distributedInfo
    if isinstance(info, dict) and "rank" in info and parse_rank(info) is None:
        notes.append(f"distributedInfo.rank is not a valid rank ({_short_repr(info.get('rank'))}): ignored")
    return TraceTable(
        event_cols=events, flow_cols=flows, meta=meta, path=str(p), notes=notes, comm_cols=builder.comms,
        hw_cols=builder.hw, memory_cols=memory_frame(builder.memory), shape_cols=builder.shapes,
    )


def _check_skipped(p: Path, b: Merger) -> None:
    """Too many unreadable events: the file is not a trace we can stand behind."""
    if b.skipped and b.n_raw == 0:
        raise DataError(
            f"{p}: no trace event could be read ({b.skipped:,} unexpected trace event(s), "
            f"first: {b.first_problem})"
        )
    if b.skipped > b.n_raw // 10 and b.skipped > 100:  # more than ~10% bad: too broken to trust
        raise DataError(
            f"{p}: {b.skipped:,} of {b.skipped + b.n_raw:,} trace events are unreadable "
            f"(first: {b.first_problem}); the file is too damaged to analyse"
        )


def _load_notes(b: Merger, dropped: int) -> list[str]:
    notes = []
    if b.skipped:
        notes.append(
            f"{b.skipped:,} of {b.skipped + b.n_raw:,} trace events could not be read and were "
            f"skipped (first: {b.first_problem})"
        )
    if b.repaired_utf8:
        notes.append(f"{b.repaired_utf8:,} event(s) held invalid UTF-8: bad bytes replaced by U+FFFD")
    for fld, n in sorted(b.out_of_range.items()):
        notes.append(f"{n:,} event(s) have {fld} that is not a 64-bit integer: read as absent")
    if dropped:
        notes.append(f"{dropped:,} event(s) with a timestamp or duration out of range were left out")
    if b.shapes_dropped:
        notes.append(f"{b.shapes_dropped:,} operator(s) with input shapes beyond the first "
                     f"{len(b.shape_table):,} distinct ones: their shapes were left out")
    return notes


def _short_repr(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
