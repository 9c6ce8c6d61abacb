"""An Nsight Systems SQLite export -> one :class:`~lmprof.trace.load.TraceTable` per process.

The export's rows become the events a Kineto trace of the same program would hold, in the same
columns (see :mod:`lmprof.trace.load`), so every analysis reads them unchanged:

==========================  ==================  ==============================================
export table                category            columns filled
==========================  ==================  ==============================================
CUPTI_ACTIVITY_KIND_KERNEL  kernel              name (demangled), pid = device, tid = stream,
                                                correlation, stream, device; registers and
                                                shared memory (static + dynamic) per kernel
CUPTI_ACTIVITY_KIND_MEMCPY  gpu_memcpy          ``Memcpy HtoD (Pinned -> Device)``, bytes
CUPTI_ACTIVITY_KIND_MEMSET  gpu_memset          ``Memset (Device)``, bytes
CUPTI_ACTIVITY_KIND_RUNTIME cuda_runtime,       name without ``_vNNNN``, pid/tid from
                            cuda_driver         globalTid, correlation
NVTX_EVENTS (ranges)        user_annotation,    see :mod:`lmprof.trace.nsys.names`; pid/tid from
                            cpu_op              globalTid, seq from emit_nvtx's ``seq = N``
==========================  ==================  ==============================================

Times are the export's nanoseconds divided by 1,000 (microseconds, as Kineto writes them).

**One table per process.** A Kineto trace holds one process; an export of ``torchrun`` holds every
rank's process. Each process with CUDA activity (kernels, copies, runtime calls) becomes one table,
analysed as one rank is (numbered by process id, since the export does not record ranks); an
export without CUDA activity gives one table per process with NVTX ranges. A device event belongs
to the process in its ``globalPid``, else to the process of the runtime call that launched it
(same ``correlationId``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmprof.errors import DataError
from lmprof.trace.fields import HW_COLUMNS, ID_COLUMNS
from lmprof.trace.frame import Frame, str_labels
from lmprof.trace.load import TraceTable
from lmprof.trace.nsys.files import FORMAT
from lmprof.trace.nsys import names as nm
from lmprof.trace.nsys.read import Export
from lmprof.trace.nsys.schema import DRIVER_CLASS, KERNEL, MEMCPY, MEMSET, NVTX, NVTX_RANGE_TYPES, RUNTIME, SOURCES

CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", nm.OPERATOR, nm.ANNOTATION)
_CAT = {c: i for i, c in enumerate(CATS)}
_DEVICE_CATS = frozenset({_CAT["kernel"], _CAT["gpu_memcpy"], _CAT["gpu_memset"]})
# More than this share of names that do not resolve: the export is damaged, not worth a report
_MAX_UNRESOLVED = 0.1


@dataclass
class _Part:
    """Rows of one export table, as columns lmprof's table has, before they are split by process."""

    start: np.ndarray  # ns
    end: np.ndarray
    names: np.ndarray  # object array of str
    cat: np.ndarray  # codes into CATS
    pid: np.ndarray
    tid: np.ndarray
    proc: np.ndarray  # the process the row belongs to (-1: unknown)
    args: dict[str, np.ndarray]
    hw: dict[str, np.ndarray] = field(default_factory=dict)  # float columns, for device parts


def load_export(path: str | Path) -> list[TraceTable]:
    """The tables of one export, one per process (see the module docstring); DataError when the file
    is not an export lmprof can read."""
    p = Path(path)
    exp = Export(p)
    try:
        exp.check_is_export()
        return _tables(exp, p)
    finally:
        exp.close()


def _tables(exp: Export, p: Path) -> list[TraceTable]:
    notes: list[str] = []
    reads = {t: exp.read(SOURCES[t], **_read_args(t)) for t in (KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX) if exp.has(t)}
    for t, (_, _, skipped) in reads.items():
        if skipped:
            what = "ranges never ended or with" if t == NVTX else "rows with"
            notes.append(f"{t}: {skipped:,} {what} times that are not integers were left out")
    strings = _Strings(exp, reads)
    parts: list[_Part] = []
    if RUNTIME in reads:
        parts.append(_runtime(reads[RUNTIME][0], strings))
    if NVTX in reads:
        parts.append(_nvtx(reads[NVTX][0], reads[NVTX][1], strings))
    host_proc = _launch_process(parts[0] if RUNTIME in reads else None)
    if KERNEL in reads:
        parts.append(_kernels(reads[KERNEL][0], strings, host_proc))
    if MEMCPY in reads:
        parts.append(_copies(reads[MEMCPY][0], host_proc))
    if MEMSET in reads:
        parts.append(_sets(reads[MEMSET][0], host_proc))
    notes += strings.check(p)
    parts = [x for x in parts if len(x.start)]
    if not parts:
        raise DataError(f"{p}: the export has no events (kernels, copies, runtime calls or NVTX ranges)")
    procs = _processes(parts)
    unknown = sum(int((x.proc < 0).sum()) for x in parts if _is_device(x))
    if unknown and len(procs) == 1:
        for x in parts:
            x.proc[x.proc < 0] = procs[0]
    elif unknown:
        notes.append(f"{unknown:,} device event(s) of no known process were left out")
    if len(procs) > 1:
        notes.append(f"one of {len(procs)} processes of the export (processes {', '.join(map(str, procs[:8]))}"
                     f"{', ...' if len(procs) > 8 else ''}): each is analysed as one rank")
    devices = exp.device_names()
    return [_table(p, parts, proc, notes, devices, len(procs) > 1) for proc in procs]


def _read_args(table: str) -> dict[str, str]:
    if table == NVTX:
        return {"where": f"\"eventType\" IN ({', '.join(map(str, NVTX_RANGE_TYPES))})", "text": "text"}
    return {}


class _Strings:
    """StringIds, read once for every id the event tables refer to; unresolved ids are counted."""

    def __init__(self, exp: Export, reads: dict[str, tuple[dict[str, np.ndarray], list[object], int]]) -> None:
        wanted: set[int] = set()
        for t, col in ((KERNEL, "demangledName"), (KERNEL, "shortName"), (RUNTIME, "nameId"), (NVTX, "textId")):
            if t in reads:
                wanted.update(np.unique(reads[t][0][col]).tolist())
        wanted.discard(-1)
        self.values = exp.strings(wanted)
        self.asked = 0
        self.missing = 0
        self.first_missing: int | None = None

    def names(self, ids: np.ndarray, fallback: np.ndarray | None = None) -> np.ndarray:
        """Each id's string; where it does not resolve, ``fallback``'s (the same rows' other id)."""
        got = self._lookup(ids)
        if fallback is not None:
            bad = _is_none(got)
            if bad.any():
                got[bad] = self._lookup(fallback[bad])
        bad = _is_none(got)
        self.asked += len(ids)
        if bad.any():
            self.missing += int(bad.sum())
            if self.first_missing is None:
                self.first_missing = int(ids[bad][0])
            got[bad] = [f"<unresolved string id {int(i)}>" for i in ids[bad]]
        return got

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        if not len(ids):
            return np.empty(0, dtype=object)
        uniq, inverse = np.unique(ids, return_inverse=True)
        resolved = np.empty(len(uniq), dtype=object)
        resolved[:] = [self.values.get(int(i)) for i in uniq]
        return resolved[inverse.reshape(-1)]

    def check(self, p: Path) -> list[str]:
        if not self.missing:
            return []
        if self.missing > _MAX_UNRESOLVED * self.asked:
            raise DataError(f"{p}: {self.missing:,} of {self.asked:,} names are string ids that StringIds does not "
                            f"hold (first: {self.first_missing}); the export is incomplete: export the report again")
        return [f"{self.missing:,} name(s) are string ids StringIds does not hold (first: {self.first_missing}): "
                f"shown as <unresolved string id N>"]


def _is_none(values: np.ndarray) -> np.ndarray:
    return np.fromiter((v is None for v in values), dtype=bool, count=len(values))


def _none(n: int) -> np.ndarray:
    return np.full(n, -1, dtype=np.int64)


def _args(n: int, **given: np.ndarray) -> dict[str, np.ndarray]:
    return {a: given.get(a, _none(n)) for a in ID_COLUMNS}


def _process_ids(global_ids: np.ndarray) -> np.ndarray:
    return np.where(global_ids >= 0, (global_ids >> 24) & 0xFFFFFF, -1)


def _runtime(c: dict[str, np.ndarray], strings: _Strings) -> _Part:
    n = len(c["start"])
    raw = strings.names(c["nameId"])
    uniq, inverse = np.unique(raw, return_inverse=True) if n else (raw, np.zeros(0, dtype=np.int64))
    names = np.array([nm.runtime_name(str(s)) for s in uniq], dtype=object)[inverse] if n else raw
    driver = c["eventClass"] == DRIVER_CLASS
    unknown = c["eventClass"] < 0  # an export without eventClass: the driver API's names start with "cu" only
    if unknown.any():
        by_name = np.array([not str(s).startswith("cuda") and str(s).startswith("cu") for s in names], dtype=bool)
        driver = np.where(unknown, by_name, driver)
    cat = np.where(driver, _CAT["cuda_driver"], _CAT["cuda_runtime"]).astype(np.int32)
    gtid = c["globalTid"]
    return _Part(c["start"], c["end"], names, cat, _process_ids(gtid), np.where(gtid >= 0, gtid & 0xFFFFFF, -1),
                 _process_ids(gtid), _args(n, correlation=c["correlationId"]))


def _nvtx(c: dict[str, np.ndarray], texts: list[object], strings: _Strings) -> _Part:
    n = len(c["start"])
    text = np.empty(n, dtype=object)
    text[:] = texts
    registered = _is_none(text)  # a registered string (nvtxDomainRegisterString): its id in textId
    text[registered] = strings.names(c["textId"][registered])
    names = np.empty(n, dtype=object)
    cat = np.empty(n, dtype=np.int32)
    seq = np.empty(n, dtype=np.int64)
    for i, t in enumerate(text.tolist()):
        names[i], kind, seq[i] = nm.nvtx_event(t)
        cat[i] = _CAT[kind]
    gtid = c["globalTid"]
    return _Part(c["start"], c["end"], names, cat, _process_ids(gtid), np.where(gtid >= 0, gtid & 0xFFFFFF, -1),
                 _process_ids(gtid), _args(n, seq=seq))


def _launch_process(runtime: _Part | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted correlation ids of the runtime calls and their processes (to place device events)."""
    if runtime is None:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    corr = runtime.args["correlation"]
    ok = corr >= 0
    order = np.argsort(corr[ok], kind="stable")
    return corr[ok][order], runtime.proc[ok][order]


def _device_process(global_pid: np.ndarray, corr: np.ndarray, launch: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    proc = _process_ids(global_pid)
    keys, procs = launch
    need = (proc < 0) & (corr >= 0)
    if need.any() and keys.size:
        pos = np.minimum(np.searchsorted(keys, corr[need]), keys.size - 1)
        hit = keys[pos] == corr[need]
        got = np.where(hit, procs[pos], -1)
        proc[need] = got
    return proc


def _device_part(c: dict[str, np.ndarray], names: np.ndarray, cat: str, launch: tuple[np.ndarray, np.ndarray],
                 hw: dict[str, np.ndarray]) -> _Part:
    n = len(c["start"])
    dev, stream = c["deviceId"], c["streamId"]
    full = {f: hw.get(f, np.full(n, np.nan)) for f in HW_COLUMNS}
    return _Part(c["start"], c["end"], names, np.full(n, _CAT[cat], dtype=np.int32), dev.copy(), stream.copy(),
                 _device_process(c["globalPid"], c["correlationId"], launch),
                 _args(n, correlation=c["correlationId"], stream=stream, device=dev), full)


def _nonneg(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, x, np.nan).astype(np.float64)


def _kernels(c: dict[str, np.ndarray], strings: _Strings, launch: tuple[np.ndarray, np.ndarray]) -> _Part:
    names = strings.names(c["demangledName"], fallback=c["shortName"])
    static, dynamic = c["staticSharedMemory"], c["dynamicSharedMemory"]
    shared = np.where((static >= 0) & (dynamic >= 0), static + dynamic, -1)
    return _device_part(c, names, "kernel", launch, {"registers": _nonneg(c["registersPerThread"]),
                                                      "shared_memory": _nonneg(shared)})


def _copies(c: dict[str, np.ndarray], launch: tuple[np.ndarray, np.ndarray]) -> _Part:
    keys = np.stack([c["copyKind"], c["srcKind"], c["dstKind"]], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    labels = np.array([nm.copy_name(*map(int, k)) for k in uniq], dtype=object)
    return _device_part(c, labels[inverse.reshape(-1)], "gpu_memcpy", launch, {"nbytes": _nonneg(c["bytes"])})


def _sets(c: dict[str, np.ndarray], launch: tuple[np.ndarray, np.ndarray]) -> _Part:
    uniq, inverse = np.unique(c["memKind"], return_inverse=True)
    labels = np.array([nm.set_name(int(k)) for k in uniq], dtype=object)
    return _device_part(c, labels[inverse.reshape(-1)], "gpu_memset", launch, {"nbytes": _nonneg(c["bytes"])})


def _is_device(x: _Part) -> bool:
    return bool(x.hw)


def _processes(parts: list[_Part]) -> list[int]:
    """The processes that become tables: those with CUDA activity, else those with NVTX ranges;
    ``[-1]`` (one table of everything) when no row names its process."""
    runtime = [_CAT["cuda_runtime"], _CAT["cuda_driver"]]
    cuda: set[int] = set()
    found: set[int] = set()
    for x in parts:
        found.update(np.unique(x.proc[x.proc >= 0]).tolist())
        active = x.proc[np.ones(len(x.proc), dtype=bool) if _is_device(x) else np.isin(x.cat, runtime)]
        cuda.update(np.unique(active[active >= 0]).tolist())
    return sorted(cuda or found) or [-1]


def _table(p: Path, parts: list[_Part], proc: int, notes: list[str], devices: dict[int, str], many: bool) -> TraceTable:
    mine = [(x, (x.proc == proc) if proc >= 0 else np.ones(len(x.proc), dtype=bool)) for x in parts]
    start = np.concatenate([x.start[k] for x, k in mine])
    end = np.concatenate([x.end[k] for x, k in mine])
    order = np.argsort(start, kind="stable")
    labels: dict[str, int] = {}
    codes = np.concatenate([_codes(x.names[k], labels) for x, k in mine])[order]
    cols: dict[str, np.ndarray] = {
        "name": codes,
        "cat": np.concatenate([x.cat[k] for x, k in mine])[order],
        "pid": np.concatenate([x.pid[k] for x, k in mine])[order],
        "tid": np.concatenate([x.tid[k] for x, k in mine])[order],
        "ts": start[order] / 1e3,
        "dur": (end - start)[order] / 1e3,
    }
    for a in ID_COLUMNS:
        cols[a] = np.concatenate([x.args[a][k] for x, k in mine])[order]
    events = Frame(cols, {"name": str_labels(list(labels)), "cat": str_labels(list(CATS))})
    if events.empty:
        raise DataError(f"{p}: the export has no events of process {proc}")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    hw = _hw_frame(mine, inverse)
    used = sorted({int(d) for d in np.unique(cols["device"][np.isin(cols["cat"], list(_DEVICE_CATS))]) if d >= 0})
    props = [{"id": d, "name": devices[d]} for d in used if d in devices]
    path = f"{p} (process {proc})" if many else str(p)
    flows = Frame({"id": _none(0), "ph": np.zeros(0, dtype=np.int32), "cat": np.zeros(0, dtype=np.int32),
                   "pid": _none(0), "tid": _none(0), "ts": np.zeros(0)},
                  {"ph": str_labels([]), "cat": str_labels([])})
    meta = {"distributedInfo": None, "deviceProperties": props or None, "format": FORMAT,
            "process": proc if proc >= 0 else None}
    return TraceTable(event_cols=events, flow_cols=flows, meta=meta, path=path, notes=list(notes), hw_cols=hw)


def _codes(names: np.ndarray, labels: dict[str, int]) -> np.ndarray:
    if not len(names):
        return np.zeros(0, dtype=np.int32)
    uniq, inverse = np.unique(names, return_inverse=True)
    table = np.array([labels.setdefault(str(u), len(labels)) for u in uniq], dtype=np.int32)
    return table[inverse.reshape(-1)]


def _hw_frame(mine: list[tuple[_Part, np.ndarray]], inverse: np.ndarray) -> Frame:
    """Rows (in the sorted table) of the device events with a register count or a byte count."""
    base = 0
    rows, cols = [], {f: [] for f in HW_COLUMNS}  # type: ignore[var-annotated]
    for x, k in mine:
        n = int(k.sum())
        if x.hw:
            sel = {f: x.hw[f][k] for f in HW_COLUMNS}
            keep = ~np.isnan(sel["registers"]) | ~np.isnan(sel["nbytes"])
            rows.append(inverse[base + np.flatnonzero(keep)])
            for f in HW_COLUMNS:
                cols[f].append(sel[f][keep])
        base += n
    r = np.concatenate(rows) if rows else _none(0)
    order = np.argsort(r, kind="stable")
    return Frame({"row": r[order],
                  **{f: (np.concatenate(cols[f]) if cols[f] else np.zeros(0))[order] for f in HW_COLUMNS}})
