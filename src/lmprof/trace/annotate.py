"""``lmprof analyze TRACE --annotate OUT``: a copy of the trace with lmprof's findings added as tracks.

The copy is the input's bytes, unchanged, with extra events appended to its ``traceEvents`` list, so
Perfetto and chrome://tracing open it as they open the input, with one more process,
``lmprof findings`` (pid :data:`PID`), holding:

* ``steps``: one range per ``ProfilerStep``, its args the forward / backward / optimizer split and
  the critical path's segments of that step;
* ``device idle``: every idle gap of the device window, named by its cause (``sync``, ``host_bound``,
  ``other``: the rules of :class:`lmprof.trace.timeline.IdleCauses`), the longest
  :data:`MAX_RANGES` when there are more;
* ``dead windows``: for each annotation range, the stretch from its start to its first operator;
* counters ``memory allocated <device>`` (``profile_memory=True`` traces) over time;
* an instant event ``lmprof analyze`` at the trace's start whose args hold the whole report of the
  trace (the ``--json`` figures).

Memory stays bounded: the input is streamed through the same splitter the loader uses (the events
are copied, never decoded) and written gzipped when ``OUT`` ends in ``.gz``, atomically.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import orjson

from lmprof.atomic import atomic_path, write_failure
from lmprof.errors import ConfigError
from lmprof.outdir import check_not_input
from lmprof.trace.analyze import Report, TraceReport, analyze_table, combine, find_traces, json_ready
from lmprof.trace.annotations import dead_windows
from lmprof.trace.load import TraceTable, load_trace
from lmprof.trace.read import open_stream
from lmprof.trace.records import as_dict
from lmprof.trace.kineto.split import Splitter
from lmprof.trace.steps import profiler_steps
from lmprof.trace.timeline import GAP_CAUSES, idle_gaps, select_device

PID = 2_147_483_646  # a process id no real trace uses: lmprof's own process in the viewer
TRACKS = {"steps": 1, "device idle": 2, "dead windows": 3}
MAX_RANGES = 100_000  # per track: a trace with more gaps gets the longest ones


def _meta(name: str, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "M", "name": name, "pid": PID, "args": args}
    if tid is not None:
        e["tid"] = tid
    return e


def finding_events(table: TraceTable, report: TraceReport, include_last_step: bool = False) -> Iterator[dict[str, Any]]:
    """The events lmprof adds for one trace (see the module docstring)."""
    yield _meta("process_name", None, {"name": "lmprof findings"})
    yield _meta("process_sort_index", None, {"sort_index": -1})
    for track, tid in TRACKS.items():
        yield _meta("thread_name", tid, {"name": track})
    ev = table.event_cols
    ts = ev["ts"]
    yield {"ph": "i", "s": "p", "name": "lmprof analyze", "pid": PID, "tid": TRACKS["steps"],
           "ts": float(ts.min()) if ts.size else 0.0, "args": json_ready(_report_args(report))}
    yield from _steps(table, report)
    sel = select_device(table, include_last_step)
    if sel is not None:
        g0, g1, cause = idle_gaps(table, sel)
        keep = _longest(g1 - g0)
        for a, b, c in zip(g0[keep].tolist(), g1[keep].tolist(), cause[keep].tolist()):
            yield {"ph": "X", "name": f"idle: {GAP_CAUSES[c]}", "cat": "lmprof", "pid": PID,
                   "tid": TRACKS["device idle"], "ts": a, "dur": b - a}
    rows, first = dead_windows(table)
    labels, codes = ev.labels("name"), ev["name"]
    ok = np.isfinite(first)
    rows, first = rows[ok], first[ok]
    keep = _longest(first - ts[rows])
    for r, f in zip(rows[keep].tolist(), first[keep].tolist()):
        yield {"ph": "X", "name": f"dead: {labels[codes[r]]}", "cat": "lmprof", "pid": PID,
               "tid": TRACKS["dead windows"], "ts": float(ts[r]), "dur": f - float(ts[r])}
    if report.memory is not None and not table.memory_cols.empty:
        t0 = float(table.memory_cols["ts"].min())
        for d in report.memory.devices:
            for t, v in zip(d.timeline_us, d.timeline_bytes):
                yield {"ph": "C", "name": f"memory allocated {d.device}", "pid": PID, "ts": t0 + t,
                       "args": {"bytes": v}}


def _longest(length: np.ndarray) -> np.ndarray:
    """Indices of at most MAX_RANGES of the longest, in time order."""
    if length.size <= MAX_RANGES:
        return np.arange(length.size)
    return np.sort(np.argsort(-length, kind="stable")[:MAX_RANGES])


def _report_args(report: TraceReport) -> dict[str, Any]:
    return {k: v for k, v in as_dict(report).items() if k != "path"}


def _steps(table: TraceTable, report: TraceReport) -> Iterator[dict[str, Any]]:
    steps = profiler_steps(table)
    if steps.empty:
        return
    phases = {s.step: s.phases_us for s in report.phases.steps} if report.phases else {}
    paths = {p.step: p.segments_us for p in report.critical_path.steps} if report.critical_path else {}
    for s, t, d in zip(steps["step"].tolist(), steps["ts"].tolist(), steps["dur"].tolist()):
        args: dict[str, Any] = {"step": s}
        if s in phases:
            args["phases_us"] = phases[s]
        if s in paths:
            args["critical_path_us"] = paths[s]
        yield {"ph": "X", "name": f"step {s}", "cat": "lmprof", "pid": PID, "tid": TRACKS["steps"], "ts": t,
               "dur": d, "args": json_ready(args)}


def write_annotated(source: Path, out: Path, events: Iterator[dict[str, Any]]) -> int:
    """Copy the trace at ``source`` to ``out`` with ``events`` appended to its event list; returns how
    many were added. ``out`` ending in ``.gz`` is gzipped. Refuses to overwrite ``source``."""
    check_not_input(out, [source], what="--annotate")
    added = 0
    try:
        with atomic_path(out) as tmp:
            raw = open(tmp, "wb")
            # level 1: a 270 MB trace compresses in seconds, and a viewer reads any level
            f: IO[bytes] = (
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if out.name.endswith(".gz") else raw  # type: ignore[assignment]
            )
            try:
                added = _copy(source, f, events)
            finally:
                f.close()
                raw.close()
    except OSError as exc:
        raise write_failure(out, exc) from None
    return added


def _copy(source: Path, f: IO[bytes], events: Iterator[dict[str, Any]]) -> int:
    state = {"emits": 0, "content": False}
    splitter: Splitter

    def on_events(view: memoryview, exact: bool) -> None:
        # the view is the buffer from the list's "[" (or the comma before the next event) to the
        # comma (or "]") after the run, both set to brackets: the bytes between are the input's own
        body = view[1:-1]
        if state["emits"] == 0:
            f.write(splitter.prefix)  # everything up to and including the list's "["
        else:
            f.write(b",")
        f.write(body)
        state["emits"] += 1
        if not state["content"] and bytes(body).strip():
            state["content"] = True

    splitter = Splitter(source, on_events)
    with open_stream(source) as stream:
        splitter.read_all(stream)
    rest = splitter.finish()[len(splitter.prefix):]  # from the list's closing "]" to the end
    if state["emits"] == 0:
        f.write(splitter.prefix)
    added = 0
    for e in events:
        if state["content"] or added:
            f.write(b",\n")
        f.write(orjson.dumps(e, option=orjson.OPT_SERIALIZE_NUMPY))
        added += 1
    f.write(rest)
    return added


def annotate_path(
    path: str | Path, out: str | Path, *, top: int = 10, include_last_step: bool = False
) -> tuple[Report, int]:
    """Analyse the one trace at ``path`` and write its annotated copy to ``out``.

    Returns the report and how many events were added. ``out`` is checked before the trace is read.
    """
    files = find_traces(path)
    if len(files) != 1:
        raise ConfigError(f"--annotate takes one trace, {path} holds {len(files)}: annotate each rank's trace alone")
    out = Path(out)
    check_not_input(out, [files[0], path], what="--annotate")
    table = load_trace(files[0], flows=False)  # no analysis reads them
    rep = analyze_table(table, top=top, include_last_step=include_last_step)
    added = write_annotated(files[0], out, finding_events(table, rep, include_last_step))
    return combine([rep]), added
