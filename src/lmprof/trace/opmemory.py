"""Memory of a ``profile_memory=True`` trace: bytes per operator and annotation, peak, over time.

Per event, torch's own rule (``key_averages()``'s ``cpu_memory_usage`` / ``device_memory_usage``):
an event's inclusive bytes are the net bytes (allocations minus frees) of every allocator event whose
time lies within its range, ends included, on any thread; its self bytes are its inclusive bytes
minus those of the host events directly inside it. Like torch, an event that is the only event
inside one of the same name (``aten::sum`` calling ``aten::sum``) is merged into it: not counted,
its children become its parent's. CPU bytes are the CPU, MKLDNN and IDEEP
allocators'; device bytes CUDA's, HIP's and PrivateUse1's. Rows sum over the events of one name.

Rows are ranked two ways, both kept: by inclusive bytes (``top``, as torch's table sorted by
``cpu_memory_usage``, the default of ``lmprof analyze``) and by self bytes (``top_self``, where each
byte is on the one operator that allocated it: ``aten::empty`` rather than the ``aten::randn`` that
called it). ``lmprof analyze --sort self`` shows the second.
"""
from __future__ import annotations


import numpy as np

from lmprof.trace import groups, kinds
from lmprof.trace.frame import Frame
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import parents
from lmprof.trace.records import Record

# c10::DeviceType codes as Kineto writes them in "Device Type"
CPU_TYPES = (0, 2, 5)  # CPU, MKLDNN, IDEEP
DEVICE_TYPES = (1, 6, 20)  # CUDA, HIP, PrivateUse1
_TYPE_NAMES = {0: "cpu", 1: "cuda", 2: "mkldnn", 5: "ideep", 6: "hip", 20: "privateuse1"}
TIMELINE_POINTS = 200


class MemoryOpRow(Record, frozen=True):
    """All events of one operator / annotation name; bytes summed over its events."""

    name: str
    count: int
    cpu_bytes: int  # inclusive net bytes: torch's cpu_memory_usage
    self_cpu_bytes: int  # torch's self_cpu_memory_usage
    cpu_allocated_bytes: int  # inclusive, allocations only
    cpu_freed_bytes: int  # inclusive, frees only (positive)
    device_bytes: int  # torch's device_memory_usage (cuda_memory_usage)
    self_device_bytes: int


class MemoryDevice(Record, frozen=True):
    """One allocator (device type and index) over the trace."""

    device: str  # "cpu", "cuda:0", ...
    events: int
    allocated_bytes: int  # summed allocations
    freed_bytes: int  # summed frees (positive)
    peak_allocated_bytes: int  # the allocator's own "Total Allocated", at its highest
    peak_at_us: float  # since the first allocator event
    peak_reserved_bytes: int | None  # "Total Reserved" (caching allocators), None when not recorded
    # total allocated over time, at most TIMELINE_POINTS points: the highest value in each of equal
    # time bins (so the peak is never lost), at its time since the first allocator event
    timeline_us: list[float]
    timeline_bytes: list[int]


class MemoryReport(Record, frozen=True):
    """Memory figures of a trace recorded with ``profile_memory=True``."""

    events: int  # allocator events
    outside_bytes: int  # net CPU bytes of allocator events outside every host event (torch's "[memory]" row)
    devices: list[MemoryDevice]
    top: list[MemoryOpRow]  # by inclusive CPU + device bytes (net), largest first (see SORTS)
    top_self: list[MemoryOpRow]  # by self CPU + device bytes (net), largest first


# how rows may be ranked: by the bytes of (CPU, device) that each key names; ties by CPU bytes
# allocated, then by first appearance
SORTS = {"inclusive": ("cpu", "device"), "self": ("self_cpu", "self_device")}


def per_event_bytes(table: TraceTable) -> dict[str, np.ndarray]:
    """Inclusive and self net bytes of every event (CPU and device allocators), indexed like events.

    Only host events get bytes (device events and GPU-track markers get 0). ``kept`` marks the
    host events torch keeps (see the module docstring for the merge).
    """
    ev = table.event_cols
    mem = table.memory_cols
    n = len(ev)
    host = kinds.host_mask(table)
    ts = ev["ts"]
    end = table.ends()
    mts = mem["ts"]
    dtype = mem["device_type"]
    nbytes = mem["bytes"]
    order = np.argsort(mts, kind="stable")
    mts = mts[order]
    par, kept = _merged_parents(table, host)
    out: dict[str, np.ndarray] = {"kept": kept}
    for key, types in (("cpu", CPU_TYPES), ("device", DEVICE_TYPES)):
        b = np.where(np.isin(dtype, types), nbytes, 0)[order]
        for part, vals in (("", b), ("alloc_", np.maximum(b, 0)), ("free_", np.maximum(-b, 0))):
            csum = np.concatenate([[0], np.cumsum(vals)])
            incl = csum[np.searchsorted(mts, end, "right")] - csum[np.searchsorted(mts, ts, "left")]
            incl = np.where(host, incl, 0)
            out[part + key] = incl
        incl = out[key]
        child = kept & (par >= 0)
        kids = np.bincount(par[child], weights=incl[child], minlength=n)
        out["self_" + key] = incl - np.rint(kids).astype(np.int64)
    return out


def _merged_parents(table: TraceTable, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parents after torch's merge of an only child into a parent of the same name, and the kept events."""
    par = parents(table).copy()
    codes = table.event_cols["name"]
    kept = host.copy()
    while True:  # one round per level of a chain of same-named only children (short)
        has = kept & (par >= 0)
        nkids = np.bincount(par[has], minlength=len(par))
        up = np.maximum(par, 0)
        merge = has & (codes == codes[up]) & (nkids[up] == 1)
        merge &= ~merge[up]  # the top of a chain first; the rest next round
        if not merge.any():
            return par, kept
        moved = kept & (par >= 0) & merge[up]
        par[moved] = par[par[moved]]
        kept &= ~merge


def memory_report(table: TraceTable, top: int = 10) -> MemoryReport | None:
    """Per-name memory of operators and annotations, peak and timeline; None without allocator events."""
    mem = table.memory_cols
    if mem.empty:
        return None
    ev = table.event_cols
    per = per_event_bytes(table)
    named = (kinds.op_mask(table) | kinds.annotation_mask(table)) & per.pop("kept")
    rows = np.flatnonzero(named)
    # per name, in order of first appearance; then ranked each way of SORTS (stable)
    uniq, g = groups.group_by(ev["name"][rows], sort=False)
    count = groups.group_sizes(g, len(uniq))
    sums = {k: groups.group_isum(g, len(uniq), v[rows]) for k, v in per.items()}
    cats = ev.labels("name")

    def ranked(cpu: str, device: str) -> list[MemoryOpRow]:
        rank = np.maximum(sums[cpu], 0) + np.maximum(sums[device], 0)
        return [
            MemoryOpRow(
                name=str(cats[int(uniq[i])]) if uniq[i] >= 0 else "", count=int(count[i]),
                cpu_bytes=int(sums["cpu"][i]), self_cpu_bytes=int(sums["self_cpu"][i]),
                cpu_allocated_bytes=int(sums["alloc_cpu"][i]), cpu_freed_bytes=int(sums["free_cpu"][i]),
                device_bytes=int(sums["device"][i]), self_device_bytes=int(sums["self_device"][i]),
            )  # fmt: skip
            for i in np.lexsort((-sums["alloc_cpu"], -rank))[:top].tolist()
        ]

    # allocator events inside no host event at all (torch lists them as a "[memory]" row)
    host = kinds.host_mask(table)
    ts = ev["ts"][host]
    end = table.ends()[host]
    inside = _covered(mem["ts"], ts, end)
    cpu = np.isin(mem["device_type"], CPU_TYPES)
    outside = int(mem["bytes"][cpu & ~inside].sum())
    return MemoryReport(events=len(mem), outside_bytes=outside, devices=_devices(mem),
                        top=ranked(*SORTS["inclusive"]), top_self=ranked(*SORTS["self"]))


def _covered(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Whether each time ``t`` lies in at least one [start, end] range."""
    if start.size == 0:
        return np.zeros(t.size, dtype=bool)
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    i = np.searchsorted(s, t, "right") - 1
    return (i >= 0) & (e[np.maximum(i, 0)] >= t)


def _devices(mem: Frame) -> list[MemoryDevice]:
    out = []
    t0 = float(mem["ts"].min())
    keys = np.stack([mem["device_type"], mem["device_id"]])
    pairs, which = np.unique(keys, axis=1, return_inverse=True)  # (device type, id) in sorted order
    which = which.reshape(-1)
    for k in range(pairs.shape[1]):
        dt, di = int(pairs[0, k]), int(pairs[1, k])
        sel = np.flatnonzero(which == k)
        sel = sel[np.argsort(mem["ts"][sel], kind="stable")]
        b = mem["bytes"][sel]
        t = mem["ts"][sel] - t0
        total = mem["total_allocated"][sel]
        if (total < 0).all():  # not recorded: rebuild it from the events
            total = np.cumsum(b)
        peak = int(np.argmax(total))
        reserved = mem["total_reserved"][sel]
        times, values = _timeline(t, total)
        name = _TYPE_NAMES.get(dt, f"type{dt}")
        out.append(MemoryDevice(
            device=name if di < 0 or dt in CPU_TYPES else f"{name}:{di}", events=len(sel),
            allocated_bytes=int(b[b > 0].sum()), freed_bytes=int(-b[b < 0].sum()),
            peak_allocated_bytes=int(total[peak]), peak_at_us=float(t[peak]),
            peak_reserved_bytes=int(reserved.max()) if (reserved > 0).any() else None,
            timeline_us=times, timeline_bytes=values,
        ))  # fmt: skip
    return out


def _timeline(t: np.ndarray, total: np.ndarray) -> tuple[list[float], list[int]]:
    """At most TIMELINE_POINTS points: each bin's highest value, at its time."""
    if t.size <= TIMELINE_POINTS:
        return t.tolist(), total.tolist()
    span = float(t[-1] - t[0]) or 1.0
    bins = np.minimum(((t - t[0]) / span * TIMELINE_POINTS).astype(np.int64), TIMELINE_POINTS - 1)
    # per bin (in bin order) its first highest value
    order = np.lexsort((np.arange(t.size), -total, bins))
    b = bins[order]
    best = order[np.concatenate([[True], b[1:] != b[:-1]])]
    return t[best].tolist(), total[best].tolist()
