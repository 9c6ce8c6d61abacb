"""From each device event back to the host: runtime call, CPU operator and annotation that launched it.

Links: a kernel / memcpy / memset and the runtime call that enqueued it (cudaLaunchKernel,
cudaMemcpyAsync, hipLaunchKernel, cuLaunchKernel, ...) carry the same ``args.correlation``. The CPU
operator and annotations around that runtime call are found by time nesting on the runtime call's
thread (:mod:`lmprof.trace.nesting`). ``External id`` names the innermost one in most traces, but
some Kineto versions fill it with the correlation id instead, so nesting is what is used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.frame import Frame
from lmprof.trace.groups import percentile
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import enclosing
from lmprof.trace.records import Record

if TYPE_CHECKING:
    import pandas as pd


def launching_calls(table: TraceTable, device_rows: np.ndarray | None = None) -> np.ndarray:
    """Row of the runtime call that launched each device row (same correlation id), or -1.

    When several runtime events share a correlation id (a runtime call and the driver call inside
    it), the runtime one wins, then the earliest. For every device row (``device_rows`` None) the
    answer is kept in the table's cache (read-only).
    """
    if device_rows is None:
        cached = table.cache.get("launching_calls")
        if cached is None:
            cached = table.cache["launching_calls"] = _launching_calls(table, _device_rows(table))
            cached.setflags(write=False)
        return cached
    return _launching_calls(table, device_rows)


def _device_rows(table: TraceTable) -> np.ndarray:
    """The device events' rows, ascending (cached, read-only)."""
    cached = table.cache.get("device_rows")
    if cached is None:
        cached = table.cache["device_rows"] = np.flatnonzero(kinds.device_mask(table))
        cached.setflags(write=False)
    return cached


def _launching_calls(table: TraceTable, device_rows: np.ndarray) -> np.ndarray:
    ev = table.event_cols
    corr = ev["correlation"]
    rt = np.flatnonzero(kinds.runtime_mask(table) & (corr >= 0))
    out = np.full(len(device_rows), -1, dtype=np.int64)
    if rt.size == 0 or len(device_rows) == 0:
        return out
    is_driver = kinds.cat_mask(table, lambda c: c.endswith("driver"))[rt]
    order = np.lexsort((ev["ts"][rt], is_driver, corr[rt]))
    rt = rt[order]
    keys = corr[rt]
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    rt, keys = rt[first], keys[first]
    want = corr[device_rows]
    pos = np.searchsorted(keys, want)
    pos_ok = np.minimum(pos, len(keys) - 1)
    hit = (pos < len(keys)) & (keys[pos_ok] == want) & (want >= 0)
    out[hit] = rt[pos_ok[hit]]
    return out


def launch_links(table: TraceTable) -> Frame:
    """One row per device event (kernel, memcpy, memset), in the order of ``table.event_cols``.

    Columns:

    * ``event``: the device event's row
    * ``runtime``: row of the launching runtime call (-1 when it is not in the trace)
    * ``op``: row of the innermost ``cpu_op`` enclosing that runtime call on its thread (-1)
    * ``annotation``: row of the innermost ``user_annotation`` enclosing it (-1), e.g. an
      ``lmprof:<block>`` scope or ``ProfilerStep#N``
    * ``launch_delay_us``: device start minus runtime call start (NaN when unlinked)

    For other enclosing events (an outer annotation, an ``autograd::engine::evaluate_function:``
    backward node) use :func:`lmprof.trace.nesting.enclosing` on the ``runtime`` rows with a mask.
    """
    cached = table.cache.get("launch_links")
    if cached is not None:
        return cached
    ts = table.event_cols["ts"]
    dev = _device_rows(table)
    rt = launching_calls(table)  # for every device row, in order: dev's
    op = enclosing(table, rt, kinds.op_mask(table))
    ann = enclosing(table, rt, kinds.annotation_mask(table))
    delay = np.full(len(dev), np.nan)
    linked = rt >= 0
    delay[linked] = ts[dev[linked]] - ts[rt[linked]]
    out = Frame({"event": dev, "runtime": rt, "op": op, "annotation": ann, "launch_delay_us": delay})
    for c in out:
        out[c].setflags(write=False)  # cached: no caller may change what the others see
    table.cache["launch_links"] = out
    return out


def kernel_launches(table: TraceTable) -> pd.DataFrame:
    """:func:`launch_links` as a pandas DataFrame indexed by the device event's row (``event``)."""
    cached = table.cache.get("kernel_launches")
    if cached is not None:
        return cached
    links = launch_links(table)
    out = links.to_pandas().set_index("event")
    table.cache["kernel_launches"] = out
    return out


def launch_columns(table: TraceTable, rows: np.ndarray, columns: list[str]) -> dict[str, np.ndarray]:
    """Columns of :func:`launch_links` for the device ``rows`` (like pandas' ``.loc[rows, columns]``
    on :func:`kernel_launches`; KeyError for a row that is not a device event), by a binary search
    of the sorted event rows. Asked for the ``runtime`` column alone, it does not wait for the
    nesting of host events that the ``op`` and ``annotation`` columns need."""
    links: Any
    if "launch_links" not in table.cache and set(columns) <= {"event", "runtime"}:
        links = {"event": _device_rows(table), "runtime": launching_calls(table)}
    else:
        links = launch_links(table)
    rows = np.asarray(rows, dtype=np.int64)
    index = links["event"]
    pos = np.minimum(np.searchsorted(index, rows), max(len(index) - 1, 0))
    if len(index) == 0 or not np.array_equal(index[pos], rows):
        if rows.size:
            missing = rows[(len(index) == 0) | (index[pos] != rows)] if len(index) else rows
            raise KeyError(f"not device events: {missing[:10].tolist()}")
        pos = pos[:0]
    return {c: links[c][pos] for c in columns}


class LaunchStats(Record, frozen=True):
    """How kernels were launched. Times in microseconds; every figure measured from the trace.

    Kernels launched one by one (each by its own runtime call) and kernels launched by a CUDA/HIP
    graph launch (one call enqueues many kernels, all with the call's correlation id) are counted
    apart: comparing each of a graph's kernels with the one call that launched them all would count
    that call's cost once per kernel. The ``launch_*`` and ``short_kernels*`` figures cover kernels
    launched one by one; the ``graph_*`` figures the graph launches.
    """

    kernels: int  # kernels (device events of category kernel) considered
    linked: int  # of them, launched one by one with their runtime call in the trace
    launch_delay_median_us: float | None  # kernel start - runtime call start
    launch_delay_p90_us: float | None
    launch_delay_max_us: float | None
    launch_call_median_us: float | None  # duration of the launching runtime call
    launch_call_p90_us: float | None
    short_kernels: int  # kernel duration < duration of its launching runtime call
    short_kernels_pct: float | None  # share of linked kernels
    short_kernels_time_us: float  # summed duration of those kernels
    graph_launches: int  # graph launch calls (cudaGraphLaunch, ...) that launched kernels here, each once
    graph_kernels: int  # kernels launched by them
    graph_kernels_time_us: float  # summed duration of those kernels
    graph_launch_call_median_us: float | None  # duration of a graph launch call
    graph_kernels_per_launch_max: int  # the most kernels one graph launch enqueued


def is_graph_launch(name: str) -> bool:
    """A runtime call that launches a whole captured graph (cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch)."""
    return "GraphLaunch" in name


def graph_launched(table: TraceTable, kernel_rows: np.ndarray, runtime_rows: np.ndarray) -> np.ndarray:
    """Which of ``kernel_rows`` were launched by a graph launch.

    A kernel is graph-launched when its launching call is named like a graph launch (see
    :func:`is_graph_launch`) or when that call launched other kernels too (one call, many kernels,
    whatever the API is called). ``runtime_rows`` are the launching calls (-1: none).
    """
    out = np.zeros(len(kernel_rows), dtype=bool)
    linked = runtime_rows >= 0
    if not linked.any():
        return out
    by_name = kinds.name_mask(table, is_graph_launch)[runtime_rows[linked]]
    uniq, counts = np.unique(runtime_rows[linked], return_counts=True)
    shared = counts[np.searchsorted(uniq, runtime_rows[linked])] > 1
    out[linked] = by_name | shared
    return out


def launch_stats(table: TraceTable, device_rows: np.ndarray) -> LaunchStats:
    """Launch delay and "kernels shorter than their launch" over the kernel rows in ``device_rows``."""
    ev = table.event_cols
    is_kernel = kinds.kernel_mask(table)
    rows = device_rows[is_kernel[device_rows]]
    sub = launch_columns(table, rows, ["runtime", "launch_delay_us"])
    rt = sub["runtime"]
    graph = graph_launched(table, rows, rt)
    single = (rt >= 0) & ~graph
    k_rows, r_rows = rows[single], rt[single]
    dur = ev["dur"]
    delay = sub["launch_delay_us"][single]
    call = dur[r_rows]
    short = dur[k_rows] < call
    n = int(single.sum())
    g_calls, per_call = np.unique(rt[graph], return_counts=True)
    return LaunchStats(
        kernels=len(rows),
        linked=n,
        launch_delay_median_us=_pct(delay, 50),
        launch_delay_p90_us=_pct(delay, 90),
        launch_delay_max_us=float(delay.max()) if n else None,
        launch_call_median_us=_pct(call, 50),
        launch_call_p90_us=_pct(call, 90),
        short_kernels=int(short.sum()),
        short_kernels_pct=100.0 * float(short.sum()) / n if n else None,
        short_kernels_time_us=float(dur[k_rows][short].sum()),
        graph_launches=int(len(g_calls)),
        graph_kernels=int(graph.sum()),
        graph_kernels_time_us=float(np.maximum(dur[rows[graph]], 0.0).sum()),
        graph_launch_call_median_us=_pct(dur[g_calls], 50),
        graph_kernels_per_launch_max=int(per_call.max()) if per_call.size else 0,
    )


def _pct(values: np.ndarray, q: float) -> float | None:
    return percentile(values, q) if len(values) else None
