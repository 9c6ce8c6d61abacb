"""The device timeline of one rank: what the GPU did, when it was idle, and why.

Definitions follow HolisticTraceAnalysis (HTA) so the figures can be compared:

* device events are kernels, memcpys and memsets, on every stream of the trace together;
* the window runs from the first selected device event's start to the last one's end; when the
  trace has two or more ProfilerStep annotations the last step is left out, as HTA does by default
  (it is often cut short): only device events whose launching runtime call started before the last
  step began are kept (see :func:`select_device`);
* overlap across streams is counted once: a stretch of time counts as compute when any compute
  kernel runs, else communication when any NCCL/RCCL kernel runs, else memory when a memcpy/memset
  runs, else idle. Idle is the gaps in the union of all device events inside the window.
"""
from __future__ import annotations


import numpy as np

from lmprof.trace import kinds
from lmprof.trace.groups import distinct, median
from lmprof.trace.intervals import Sweep, sweep, union
from lmprof.trace.launches import launch_columns
from lmprof.trace.load import TraceTable
from lmprof.trace.records import Record
from lmprof.trace.steps import profiler_steps

_C, _M, _K = 1 << kinds.COMPUTE, 1 << kinds.COMMUNICATION, 1 << kinds.MEMORY


class Window(Record, frozen=True):
    """Which device events the device figures cover."""

    start_us: float  # trace clock, microseconds
    end_us: float
    span_us: float
    device_events: int  # device events inside (kernels + memcpy + memset)
    excluded_events: int  # device events of the trace left out by the rule
    # "all device events" | "before last ProfilerStep" | "up to end of last ProfilerStep"
    # | "launched in the trace (one ProfilerStep)" | "all device events (none launched before the cut-off)"
    rule: str


class DeviceSelection(Record, frozen=True):
    """Rows of the selected device events (sorted by start) and the window they span."""

    rows: np.ndarray
    window: Window


def select_device(table: TraceTable, include_last_step: bool = False) -> DeviceSelection | None:
    """HTA's choice of device events; None when the trace has no device activity.

    With >= 2 distinct ProfilerStep#N annotations, a device event is kept when its launching
    runtime call started before the last step's start (``include_last_step``: no later than the
    last step's end); device events whose runtime call is not in the trace are then left out.
    With one step, that step is the trace's work (HTA's cut at its start would keep none of it): a
    device event is kept when its launching call is in the trace; the device work queued before the trace
    began (a previous step's tail, launched before the profiler recorded) is left out. Without steps every device event is kept, and so it is when the
    rule would keep none (e.g. the trace has no runtime calls).
    """
    dev = np.flatnonzero(kinds.device_mask(table))
    if dev.size == 0:
        return None
    ev = table.event_cols
    ts = ev["ts"]
    keep = np.ones(len(dev), dtype=bool)
    rule = "all device events"
    cut = launch_cutoff(table, include_last_step)
    if cut is not None:
        rt = launch_columns(table, dev, ["runtime"])["runtime"]
        launch = np.where(rt >= 0, ts[np.maximum(rt, 0)], np.inf)
        keep = before_cutoff(launch, cut, include_last_step)
        rule = "up to end of last ProfilerStep" if include_last_step else "before last ProfilerStep"
    elif distinct(profiler_steps(table)["step"]).size == 1:
        keep = launch_columns(table, dev, ["runtime"])["runtime"] >= 0
        rule = "launched in the trace (one ProfilerStep)"
    if not keep.any():
        # HTA would report nothing; analysing all device work is more useful than "no device activity"
        keep = np.ones(len(dev), dtype=bool)
        rule = "all device events (none launched before the cut-off)"
    rows = dev[keep]
    start = float(ts[rows].min())
    end = float((ts[rows] + np.maximum(ev["dur"][rows], 0.0)).max())
    window = Window(start, end, end - start, int(rows.size), int(dev.size - rows.size), rule)
    return DeviceSelection(rows=rows, window=window)


def launch_cutoff(table: TraceTable, include_last_step: bool = False) -> float | None:
    """The host time the window rule of :func:`select_device` cuts at: the last ProfilerStep's start
    (its end with ``include_last_step``); None with fewer than two steps (no cut)."""
    steps = profiler_steps(table)
    if distinct(steps["step"]).size < 2:
        return None
    return float((steps["ts"] + steps["dur"]).max()) if include_last_step else float(steps["ts"].max())


def before_cutoff(host_ts: np.ndarray, cutoff: float, include_last_step: bool = False) -> np.ndarray:
    """Which host times the rule keeps: before the cut-off (no later than it with ``include_last_step``)."""
    return host_ts <= cutoff if include_last_step else host_ts < cutoff


def device_sweep(table: TraceTable, rows: np.ndarray) -> Sweep:
    """Segments of the device timeline labelled by which kernel types run (bit mask).

    Zero-length events are left out: they occupy no time and would only split idle gaps.
    """
    ev = table.event_cols
    dur = ev["dur"][rows]
    rows = rows[dur > 0]
    ts = ev["ts"][rows]
    return sweep(ts, ts + dur[dur > 0], kinds.kernel_types(table, rows), 3)


class Temporal(Record, frozen=True):
    """Where the device time went, microseconds over the window; each instant counted once.

    compute + communication + memory + idle = span. ``non_compute_us`` is HTA's non-compute time
    (communication + memory when no compute kernel runs). ``regions_us`` is HTA's kernel-type
    breakdown: time by exact set of kernel types running (e.g. "computation+communication").
    """

    span_us: float
    busy_us: float
    compute_us: float
    communication_us: float
    memory_us: float
    idle_us: float
    non_compute_us: float
    compute_pct: float
    communication_pct: float
    memory_pct: float
    idle_pct: float
    regions_us: dict[str, float]


class Overlap(Record, frozen=True):
    """HTA's communication/computation overlap: share of communication time with compute running."""

    communication_total_us: float  # union of communication kernels, overlapped or not
    overlapped_us: float  # of it, time when a compute kernel also runs
    overlap_pct: float | None  # overlapped / total, None without communication


def temporal_breakdown(table: TraceTable, sel: DeviceSelection) -> tuple[Temporal, Overlap]:
    """Compute / communication / memory / idle time of the selected device events."""
    by_state = device_sweep(table, sel.rows).time_by_state(3)
    states = np.arange(len(by_state))
    compute = float(by_state[(states & _C) > 0].sum())
    comm = float(by_state[((states & _M) > 0) & ((states & _C) == 0)].sum())
    memory = float(by_state[((states & _K) > 0) & ((states & (_C | _M)) == 0)].sum())
    busy = float(by_state[1:].sum())
    span = sel.window.span_us
    idle = max(span - busy, 0.0)
    regions = {}
    for s in range(1, len(by_state)):
        if by_state[s] > 0:
            label = "+".join(kinds.KERNEL_TYPE_NAMES[k] for k in range(3) if s & (1 << k))
            regions[label] = float(by_state[s])

    def pct(x: float) -> float:
        return 100.0 * x / span if span > 0 else 0.0

    temporal = Temporal(
        span_us=span,
        busy_us=busy,
        compute_us=compute,
        communication_us=comm,
        memory_us=memory,
        idle_us=idle,
        non_compute_us=comm + memory,
        compute_pct=pct(compute),
        communication_pct=pct(comm),
        memory_pct=pct(memory),
        idle_pct=pct(idle),
        regions_us=regions,
    )
    comm_total = float(by_state[(states & _M) > 0].sum())
    both = float(by_state[((states & _M) > 0) & ((states & _C) > 0)].sum())
    overlap = Overlap(comm_total, both, 100.0 * both / comm_total if comm_total > 0 else None)
    return temporal, overlap


class IdleCauses(Record, frozen=True):
    """Idle gaps of the device inside the window and what each waited for (microseconds).

    Every gap is given one cause, first rule that holds:

    * ``sync``: a blocking runtime call (``*Synchronize``, blocking ``cudaMemcpy``/``hipMemcpy``,
      e.g. from ``.item()``) on any host thread overlaps the gap: the host waited for the device;
    * ``host_bound``: the runtime call that launched the device event ending the gap was still
      running, or had not started, when the device went idle (launch end > gap start): the host
      was too slow to feed the device (CPU-bound or launch-overhead-bound);
    * ``other``: the next work had been enqueued before the gap began (waits on other streams or
      events), or its launch is not in the trace.
    """

    gaps: int
    idle_us: float
    sync_us: float
    host_bound_us: float
    other_us: float
    sync_gaps: int
    host_bound_gaps: int
    other_gaps: int
    largest_gap_us: float | None
    median_gap_us: float | None


GAP_CAUSES = ("sync", "host_bound", "other")  # the codes of :func:`idle_gaps`


def idle_gaps(table: TraceTable, sel: DeviceSelection) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every idle gap of the device in the window: start, end (us) and cause, an index into
    :data:`GAP_CAUSES` (the rules of :class:`IdleCauses`)."""
    ev = table.event_cols
    ts_all, dur_all = ev["ts"], np.maximum(ev["dur"], 0.0)
    sw = device_sweep(table, sel.rows)
    is_gap = (sw.state == 0) & (sw.length > 0)
    g0 = sw.start[is_gap]
    g1 = g0 + sw.length[is_gap]
    if g0.size == 0:
        return g0, g1, np.zeros(0, dtype=np.int8)

    # the device event that ends each gap; among simultaneous starts the one launched earliest
    rows = sel.rows[dur_all[sel.rows] > 0]
    rt = launch_columns(table, rows, ["runtime"])["runtime"]
    launch_end = np.where(rt >= 0, ts_all[np.maximum(rt, 0)] + dur_all[np.maximum(rt, 0)], np.inf)
    start = ts_all[rows]
    order = np.lexsort((launch_end, start))
    start_sorted, launch_end_sorted = start[order], launch_end[order]
    nxt = np.minimum(np.searchsorted(start_sorted, g1, side="left"), len(order) - 1)
    next_launch_end = launch_end_sorted[nxt]
    unlinked = ~np.isfinite(next_launch_end)

    # blocking calls anywhere on the host, merged
    sync_rows = np.flatnonzero(kinds.sync_mask(table))
    s0, s1 = union(ts_all[sync_rows], ts_all[sync_rows] + dur_all[sync_rows])
    if s0.size:
        k = np.searchsorted(s1, g0, side="right")  # first blocking stretch ending after the gap starts
        k_ok = np.minimum(k, len(s0) - 1)
        sync = (k < len(s0)) & (s0[k_ok] < g1)
    else:
        sync = np.zeros(len(g0), dtype=bool)
    host = ~sync & ~unlinked & (next_launch_end > g0)
    cause = np.where(sync, 0, np.where(host, 1, 2)).astype(np.int8)
    return g0, g1, cause


def idle_causes(table: TraceTable, sel: DeviceSelection) -> IdleCauses:
    """Split the device's idle time into sync / host-bound / other gaps (see :class:`IdleCauses`)."""
    g0, g1, cause = idle_gaps(table, sel)
    if g0.size == 0:
        return IdleCauses(0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, None, None)
    sync, host, other = cause == 0, cause == 1, cause == 2
    length = g1 - g0
    return IdleCauses(
        gaps=int(len(g0)),
        idle_us=float(length.sum()),
        sync_us=float(length[sync].sum()),
        host_bound_us=float(length[host].sum()),
        other_us=float(length[other].sum()),
        sync_gaps=int(sync.sum()),
        host_bound_gaps=int(host.sum()),
        other_gaps=int(other.sum()),
        largest_gap_us=float(length.max()),
        median_gap_us=median(length),
    )
