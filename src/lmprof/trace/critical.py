"""Critical path of each profiled step, and what-if estimates read off it.

The path is found by walking back in time from the step's end (the end of its ``ProfilerStep#N``
annotation, on the host) and, at every point, asking what the work there waited for:

* on the **host** (a thread at time t): the thread was busy with its own work back to the last
  blocking call (``*Synchronize``, blocking memcpy; :func:`kinds.is_sync_call`) that ended before t.
  If the device was still running when that call began, the host waited for the device: the path
  jumps to the device event that ended last before the call returned (the ``sync`` segment is the
  call's return after it). Otherwise the call is host time and the walk goes on before it.
* on the **device** (an event K): K started when both its launch had happened and its stream was
  free. Of the previous event on K's stream and K's launching runtime call, the one that finished
  later is the predecessor: the stream (``device_wait`` segment for a gap) or the launch (the path
  goes to the host: ``launch_latency`` from the call's end to K's start, then the call itself). When
  both finished well before K started, K waited on something else (an event recorded on another
  stream, e.g. NCCL waiting for compute): the device event on any stream that ended last before K
  started is taken as the predecessor (``cross_stream``), else the gap is ``unknown``.

When the walk reaches device work launched before the step began, the device was still busy with
an earlier step (the host runs ahead, the device is the bottleneck): the rest of the way back to the
step's start is ``previous_step``.

Segments cover the step exactly once, so they sum to the step's duration. Host segments are split
into time inside launch runtime calls (``launch_call``), in data-loader operators (``data_loader``:
an enclosing host event whose name contains ``DataLoader``) and other CPU work (``cpu``). Device
segments are ``computation``, ``communication``, ``memory`` (kernel types of :mod:`kinds`).

Limits, said in the report: one rank's trace at a time (the communication kernels on the path are
kept per step, and :mod:`lmprof.trace.crossrank` links ranks through them); cross-stream waits are inferred from timing, not from the
trace's event records; without runtime calls (correlation links) the device side cannot be linked
to the host and the path stays on the host.

What-if estimates remove time from the path: each is the step minus the removed time, so it is
**optimistic** (another path may become critical): launch overhead to zero (``launch_call`` +
``launch_latency``), communication fully overlapped (``communication``), the top kernel by device
time twice as fast (half its time on the path), the data loader off the path (``data_loader``).
"""
from __future__ import annotations

import bisect
from array import array

import msgspec
import numpy as np

from lmprof.trace import kinds
from lmprof.trace.groups import distinct, median, pair_codes
from lmprof.trace.intervals import union
from lmprof.trace.launches import launch_columns
from lmprof.trace.load import TraceTable
from lmprof.trace.records import Record
from lmprof.trace.steps import profiler_steps

SEGMENTS = (
    "cpu", "launch_call", "data_loader", "launch_latency", "computation", "communication", "memory",
    "sync", "device_wait", "cross_stream", "previous_step", "unknown",
)  # fmt: skip
_EPS = 1.0  # us: a predecessor that finished this close before K started is taken as K's cause
_MAX_STEPS_WALKED = 200
_MAX_WALK = 1_000_000  # steps of one walk; a bound that only a corrupt trace (a cycle) could reach
_SHORT_RUN = 32  # runs shorter than this are added up in Python (numpy's fixed cost is larger)


class StepPath(Record, frozen=True):
    """The critical path of one step: microseconds per segment kind (they sum to ``step_us``).

    ``step_us`` runs from the ProfilerStep's start to its end or to the end of the last device
    event its runtime calls launched, whichever is later (the host often runs ahead of the device).
    """

    step: int
    step_us: float
    segments_us: dict[str, float]
    kernels_on_path: int
    # communication kernels on the path: (events-table row, start us, us of it on the path); read
    # by :mod:`lmprof.trace.crossrank` to follow the path to the rank a collective waited for
    collectives: list[tuple[int, float, float]] = msgspec.field(default_factory=list)


class WhatIf(Record, frozen=True):
    """Step time estimated if something changed; optimistic (see the module docstring)."""

    change: str
    step_ms: float  # estimated median step
    saving_pct: float  # of the measured median step


class CriticalPath(Record, frozen=True):
    """Critical paths of the steps whose device work the window covers."""

    steps: list[StepPath]
    step_ms: float  # median measured step (of these steps)
    segments_pct: dict[str, float]  # share of the summed step time per segment kind
    top_kernel: str | None  # the kernel name with the most device time in the window
    what_if: list[WhatIf]
    linked: bool  # False when device work could not be linked to launches (path stays on host)


# Why a device event K started when it did (see :func:`_waits`); the walk follows it back.
_CROSS, _LAUNCH, _STREAM, _UNKNOWN = 0, 1, 2, 3


def _doubles(a: np.ndarray) -> array[float]:
    """``a`` as an ``array('d')``: 8 bytes a value where a list of floats holds 32. The walk reads
    these per kernel on the path, and ``tolist`` made a float object for every kernel of the trace
    (114k per list on the 259 MB trace): the critical path took 76 ms warm with lists, 59 ms so."""
    return array("d", np.ascontiguousarray(a, dtype=np.float64).tobytes())


class _Index:
    """Sorted views the walk needs, built once per trace.

    Device events are numbered by their position in end-time order. What the walk reads per device
    event is a plain Python list indexed by that position: the walk takes one step per kernel on
    the path (10^5 of them in a large trace) and a list index costs a fraction of a numpy scalar
    index or of a dict keyed by table row.
    """

    def __init__(self, table: TraceTable, dev_rows: np.ndarray) -> None:
        ev = table.event_cols
        self.ts = ev["ts"]
        # whole-table arrays are views or made once: this index is the analysis' peak of memory
        self.raw_dur = ev["dur"]
        self.end = table.ends()
        self.tid = ev["tid"]
        self.pid = ev["pid"]
        dev_rows = dev_rows[self.raw_dur[dev_rows] > 0]
        # device events by end time, all streams together: position -> table row
        order = dev_rows[np.argsort(self.end[dev_rows], kind="stable")]
        self.rows = order
        self.types = kinds.kernel_types(table, order)
        self.type_names = np.array(kinds.KERNEL_TYPE_NAMES, dtype=object)[self.types].tolist()
        self.launch = launch_columns(table, order, ["runtime"])["runtime"]  # launching call row, -1
        launched = self.launch >= 0
        call = np.maximum(self.launch, 0)
        start, end = self.ts[order], self.end[order]
        self.start = _doubles(start)
        self.dev_ends = _doubles(end)
        # the launching call's start and end; +inf / -inf without one, so no comparison picks it
        self.call_start = _doubles(np.where(launched, self.ts[call], np.inf))
        call_end = np.where(launched, self.end[call], -np.inf)
        self.call_end = _doubles(call_end)
        # one stream per (device pid, stream); the tid stands in for a missing args.stream
        stream = ev["stream"][order]
        lane = np.where(stream >= 0, stream, self.tid[order])
        wait, nxt, nxt_end = _waits(start, end, self.pid[order], lane, call_end, launched)
        # the end of the event waited for is dev_ends[next[k]]: no list of its own (114k floats)
        self.wait = array("b", np.ascontiguousarray(wait, dtype=np.int8).tobytes())
        self.next = array("q", np.ascontiguousarray(nxt, dtype=np.int64).tobytes())
        # Runs: an event that waited for a device event (stream or cross-stream) adds its own time
        # (end - start) and the gap before it (start - that event's end) to the path, then the walk
        # moves on, with nothing depending on the step, as long as the step's start t0 is before
        # all of: K's start, the end of the event it waited for, K's launch (t0 <= launch start:
        # the next float above it). ``run_until[k]`` is that bound (-inf for other waits): the walk
        # follows such chains in a tight loop and adds them up at once (:func:`_add_run`).
        chained = (wait == _STREAM) | (wait == _CROSS)
        launch_after = np.nextafter(np.where(launched, self.ts[call], np.inf), np.inf)
        self.run_until = _doubles(np.where(chained, np.minimum(np.minimum(start, nxt_end), launch_after), -np.inf))
        self.busy_us = end - start
        self.gap_us = np.where(chained, start - nxt_end, 0.0)
        self.wait_codes = wait
        # blocking calls per host thread, by end time
        sync = np.flatnonzero(kinds.sync_mask(table))
        self.sync: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
        for r in sync[np.argsort(self.end[sync], kind="stable")].tolist():
            ends, rows = self.sync.setdefault((int(self.pid[r]), int(self.tid[r])), ([], []))
            ends.append(float(self.end[r]))
            rows.append(r)
        # host intervals that classify host time: launch calls (non-sync runtime) and data loader
        runtime = np.flatnonzero(kinds.runtime_mask(table) & ~kinds.sync_mask(table))
        loader = np.flatnonzero(kinds.host_mask(table) & kinds.name_mask(table, lambda n: "DataLoader" in n))
        self.launch_iv = self._per_thread(runtime)
        self.loader_iv = self._per_thread(loader)
        self.name_codes = ev["name"]  # the name column's own codes (int32)
        self.name_categories = ev.labels("name")

    def _per_thread(self, rows: np.ndarray) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """Union of the intervals of ``rows``, per (pid, tid): one sort, then one slice per thread."""
        out: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        if rows.size == 0:
            return out
        # threads as small numbers, then one stable sort of those (each thread's rows keep their order)
        thread = pair_codes(self.pid[rows], self.tid[rows])
        order = np.argsort(thread, kind="stable")
        rows, thread = rows[order], thread[order]
        del order
        cut = np.flatnonzero(thread[1:] != thread[:-1]) + 1
        for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), rows.size]):
            sel = rows[lo:hi]
            out[(int(self.pid[sel[0]]), int(self.tid[sel[0]]))] = union(self.ts[sel], self.end[sel])
        return out

    @staticmethod
    def overlap(iv: tuple[np.ndarray, np.ndarray] | None, a: float, b: float) -> float:
        if iv is None or b <= a or iv[0].size == 0:
            return 0.0
        s, e = iv
        lo, hi = np.searchsorted(e, a, side="right"), np.searchsorted(s, b, side="left")
        if hi <= lo:
            return 0.0
        return float((np.minimum(e[lo:hi], b) - np.maximum(s[lo:hi], a)).clip(min=0).sum())


def _waits(
    start: np.ndarray, end: np.ndarray, pid: np.ndarray, lane: np.ndarray, call_end: np.ndarray, launched: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What each device event K waited for, for all events at once (the walk only looks it up).

    Inputs are per device event, sorted by ``end``: its stream is (``pid``, ``lane``); ``call_end``
    is the end of its launching runtime call (-inf when ``launched`` is False). K started when both
    its launch had happened and its stream was free. With ``prev`` the event before K on its stream
    and ``cross`` the event on any stream that ended last before K started ("before" allows 1e-6 us
    of rounding; K is never its own predecessor):

    * ``_CROSS``: both prev and the launch finished more than ``_EPS`` before K started, and cross
      ended later than both: K waited on another stream (an event record, e.g. NCCL for compute);
    * ``_LAUNCH``: else, when the launch finished no earlier than prev;
    * ``_STREAM``: else, when K has a prev: K queued behind it;
    * ``_UNKNOWN``: nothing in the trace explains K's start.

    Returns (kind, position of the event waited for (-1 for a launch or unknown), its end).
    """
    n = start.size
    if n == 0:
        return np.empty(0, dtype=np.int8), np.empty(0, dtype=np.int64), np.empty(0)
    me = np.arange(n)
    limit = start + 1e-6
    # any stream: the last end <= K's start. Never K itself nor an event after K in end order: with
    # durations under the 1e-6 us tolerance two events could otherwise each wait for the other, and
    # the walk would go round that cycle (every pointer goes to an earlier position: no cycles)
    cross = np.minimum(np.searchsorted(end, limit, side="right") - 1, me - 1)
    cross_end = np.where(cross >= 0, end[np.maximum(cross, 0)], -np.inf)
    # same stream: the same search inside each stream's events (end order kept by a stable sort)
    stream = pair_codes(pid, lane)
    grouped = np.argsort(stream, kind="stable")  # by (pid, lane), end order kept within each
    g_stream, g_end, g_lim = stream[grouped], end[grouped], limit[grouped]
    del stream
    cut = np.flatnonzero(g_stream[1:] != g_stream[:-1]) + 1
    lows, highs = [0, *cut.tolist()], [*cut.tolist(), n]
    first = np.repeat(lows, np.diff([*lows, n]))  # each stream's first position
    p = np.empty(n, dtype=np.int64)
    for lo, hi in zip(lows, highs):
        p[lo:hi] = lo + np.searchsorted(g_end[lo:hi], g_lim[lo:hi], side="right") - 1
    p = np.minimum(p, me - 1)  # same rule within the stream (group order is end order there)
    ok = p >= first
    prev = np.full(n, -1, dtype=np.int64)
    prev_end = np.full(n, -np.inf)
    prev[grouped[ok]] = grouped[p[ok]]
    prev_end[grouped[ok]] = g_end[p[ok]]
    # the decision, in the order of the module docstring
    ready = np.maximum(prev_end, call_end)
    waits_cross = (ready < start - _EPS) & (cross >= 0) & (cross_end > ready)
    waits_launch = ~waits_cross & launched & (call_end >= prev_end)
    waits_stream = ~waits_cross & ~waits_launch & (prev >= 0)
    kind = np.full(n, _UNKNOWN, dtype=np.int8)
    kind[waits_cross], kind[waits_launch], kind[waits_stream] = _CROSS, _LAUNCH, _STREAM
    nxt = np.where(waits_cross, cross, np.where(waits_stream, prev, -1))
    nxt_end = np.where(waits_cross, cross_end, np.where(waits_stream, prev_end, -np.inf))
    return kind, nxt, nxt_end


def _walk(
    ix: _Index, t0: float, t1: float, thread: tuple[int, int], last_device: int
) -> tuple[dict[str, float], list[int], list[float]]:
    """Walk back from ``t1`` to ``t0``: segment sums, and the device positions on the path with
    their microseconds on it. ``last_device``: position of the step's last-ending device event."""
    seg = dict.fromkeys(SEGMENTS, 0.0)
    on_path: list[int] = []
    on_path_us: list[float] = []
    mode, t, where = "host", t1, thread
    kernel = -1
    if last_device >= 0 and ix.dev_ends[last_device] >= t1:  # the step ends with its device work
        mode, kernel = "device", last_device
    # the lists the device steps read, as locals (the loop runs once per kernel on the path)
    starts, call_start, call_end, type_names = ix.start, ix.call_start, ix.call_end, ix.type_names
    waits, nexts, run_until, dev_ends = ix.wait, ix.next, ix.run_until, ix.dev_ends

    def host(a: float, b: float, th: tuple[int, int]) -> None:
        a = max(a, t0)
        if b <= a:
            return
        call = ix.overlap(ix.launch_iv.get(th), a, b)
        loader = min(ix.overlap(ix.loader_iv.get(th), a, b), b - a - call)
        seg["launch_call"] += call
        seg["data_loader"] += max(loader, 0.0)
        seg["cpu"] += max(b - a - call - max(loader, 0.0), 0.0)

    left = _MAX_WALK
    while left > 0:
        left -= 1
        if t <= t0:
            break
        if mode == "device" and call_start[kernel] < t0:
            # the device was still busy with work an earlier step launched: the step waited for it
            seg["previous_step"] += t - t0
            break
        if mode == "host":
            ends, rows = ix.sync.get(where, ([], []))
            i = bisect.bisect_right(ends, t) - 1
            while i >= 0 and ix.ts[rows[i]] >= t:  # a zero-length call at t does not move the walk
                i -= 1
            if i < 0 or ends[i] <= t0:
                host(t0, t, where)
                break
            s = rows[i]
            host(ends[i], t, where)
            j = bisect.bisect_right(ix.dev_ends, ends[i]) - 1
            if j >= 0 and ix.dev_ends[j] > ix.ts[s] and ix.dev_ends[j] > t0:
                seg["sync"] += ends[i] - max(ix.dev_ends[j], t0)
                kernel, mode, t = j, "device", ix.dev_ends[j]
            else:
                host(float(ix.ts[s]), ends[i], where)
                t = float(ix.ts[s])
            continue
        # device: event K (a position) ends at t
        k = kernel
        if run_until[k] > t0:  # a chain of device waits inside the step (see _Index): follow it
            run = [k]
            k = nexts[k]
            while run_until[k] > t0 and left > 0:
                left -= 1
                run.append(k)
                k = nexts[k]
            _add_run(ix, run, seg, on_path, on_path_us)
            kernel, t = k, ix.dev_ends[k]
            continue
        start = starts[k]
        a = max(start, t0)
        seg[type_names[k]] += t - a
        on_path.append(k)
        on_path_us.append(t - a)
        if start <= t0:
            break
        wait = waits[k]
        if wait == _STREAM or wait == _CROSS:
            t = dev_ends[nexts[k]]
            seg["device_wait" if wait == _STREAM else "cross_stream"] += start - max(t, t0)
            kernel = nexts[k]
        elif wait == _LAUNCH:
            c, c_start, c_end = int(ix.launch[k]), call_start[k], call_end[k]
            seg["launch_latency"] += max(start - max(c_end, t0), 0.0)
            where = (int(ix.pid[c]), int(ix.tid[c]))
            top = min(c_end, start)
            host(c_start, top, where)
            mode, t = "host", c_start
        else:
            seg["unknown"] += start - t0
            break
    return seg, on_path, on_path_us


def _add_run(
    ix: _Index, run: list[int], seg: dict[str, float], on_path: list[int], on_path_us: list[float]
) -> None:
    """Add a run of device waits to the path, in the walk's order: each segment is a sum in that
    order (as step-by-step adding gives, to the last bit), by a cumulative sum for long runs."""
    pos = np.asarray(run, dtype=np.int64)
    busy, gap = ix.busy_us[pos], ix.gap_us[pos]
    on_path += run
    on_path_us += busy.tolist()
    if len(run) < _SHORT_RUN:
        for k, b, g in zip(run, busy.tolist(), gap.tolist()):
            seg[ix.type_names[k]] += b
            seg["device_wait" if ix.wait[k] == _STREAM else "cross_stream"] += g
        return
    types, waits = ix.types[pos], ix.wait_codes[pos]
    parts = [(busy[types == code], name) for code, name in enumerate(kinds.KERNEL_TYPE_NAMES)]
    parts += [(gap[waits == _STREAM], "device_wait"), (gap[waits == _CROSS], "cross_stream")]
    for values, name in parts:
        if values.size:  # np.cumsum adds in order (np.sum adds pairwise: other last bits)
            seg[name] = float(np.cumsum(np.concatenate(([seg[name]], values)))[-1])


def critical_path(table: TraceTable, dev_rows: np.ndarray | None) -> CriticalPath | None:
    """Critical paths of the steps (all but the last when there are two or more, like the window).

    None without ProfilerStep annotations (the path is defined per step).
    """
    steps = profiler_steps(table)
    if steps.empty:
        return None
    if distinct(steps["step"]).size >= 2:
        steps = steps.take(steps["ts"] < steps["ts"].max())
    steps = steps.take(slice(0, _MAX_STEPS_WALKED))
    ev = table.event_cols
    ix = _Index(table, dev_rows if dev_rows is not None else np.empty(0, dtype=np.int64))
    paths, on_path_all = [], []
    # device work of each step: launched by a runtime call that started inside the step. Sorted by
    # that call's start, each step's work is one slice.
    launched = np.flatnonzero(ix.launch >= 0)  # positions
    by_call = launched[np.argsort(ix.ts[ix.launch[launched]], kind="stable")]
    call_ts = ix.ts[ix.launch[by_call]]
    pids, tids = ev["pid"], ev["tid"]
    for row, step, ts, dur in zip(steps["row"], steps["step"], steps["ts"], steps["dur"]):
        thread = (int(pids[row]), int(tids[row]))
        t0, host_end = float(ts), float(ts + max(dur, 0.0))
        mine = by_call[np.searchsorted(call_ts, t0, side="left") : np.searchsorted(call_ts, host_end, side="left")]
        last = -1  # the position that ends last; of several, the first in table order
        if mine.size:
            mine_end = ix.end[ix.rows[mine]]
            latest = mine[mine_end == mine_end.max()]
            last = int(latest[np.argmin(ix.rows[latest])])
        t1 = max(host_end, ix.dev_ends[last]) if last >= 0 else host_end
        seg, on_path, on_path_us = _walk(ix, t0, t1, thread, last)
        pos, us = np.asarray(on_path, dtype=np.int64), np.asarray(on_path_us, dtype=np.float64)
        rows = ix.rows[pos]
        is_comm = (ix.types[pos] == kinds.COMMUNICATION) & (us > 0)
        comm = list(zip(rows[is_comm].tolist(), ix.ts[rows[is_comm]].tolist(), us[is_comm].tolist()))
        paths.append(StepPath(int(step), t1 - t0, seg, len(on_path), comm))
        on_path_all.append(rows)
    total = sum(p.step_us for p in paths)
    sums = {k: sum(p.segments_us[k] for p in paths) for k in SEGMENTS}
    pct = {k: 100.0 * v / total if total > 0 else 0.0 for k, v in sums.items()}
    med = median([p.step_us for p in paths]) / 1e3
    top_name, top_path = _top_kernel(ix, dev_rows, np.concatenate([np.empty(0, dtype=np.int64), *on_path_all]))

    def what_if(change: str, removed_us: float) -> WhatIf:
        # the median step shrinks by the removed share of the summed step time
        new = med * (1.0 - removed_us / total) if total > 0 else med
        return WhatIf(change, new, 100.0 * (med - new) / med if med > 0 else 0.0)

    has_device = dev_rows is not None and len(dev_rows) > 0
    # without device work the first three are 0% by construction: left out rather than shown as zeros
    ifs = [
        what_if("launch overhead to zero", sums["launch_call"] + sums["launch_latency"]),
        what_if("communication fully overlapped", sums["communication"]),
        what_if("top kernel 2x faster", 0.5 * top_path),  # which kernel: CriticalPath.top_kernel
    ] if has_device else []
    ifs.append(what_if("data loader off the critical path", sums["data_loader"]))
    linked = bool(dev_rows is not None and len(dev_rows) and (ix.launch >= 0).any())
    return CriticalPath(paths, med, pct, top_name, ifs, linked)


def _top_kernel(ix: _Index, dev_rows: np.ndarray | None, path: np.ndarray) -> tuple[str | None, float]:
    if dev_rows is None or len(dev_rows) == 0:
        return None, 0.0
    codes = ix.name_codes[dev_rows]
    ok = codes >= 0
    if not ok.any():
        return None, 0.0
    sums = np.bincount(codes[ok], weights=np.maximum(ix.raw_dur[dev_rows][ok], 0.0))
    top_code = int(np.argmax(sums))
    on = float(np.maximum(ix.raw_dur[path], 0.0)[ix.name_codes[path] == top_code].sum()) if path.size else 0.0
    return str(ix.name_categories[top_code]), on
