"""Communication per collective: kind, message size, time, algorithm and bus bandwidth.

Each communication kernel (NCCL/RCCL, see :mod:`lmprof.trace.kinds`) of the device window is one
collective call. Its parameters come from the kernel's own args when the trace has them (newer
PyTorch), else from the ``record_param_comms`` operator around the call that launched it (innermost
enclosing one with a ``Collective name``): kind, ``In/Out msg nelems``, ``dtype``, ``Group size``,
process group, and the collective sequence number (``Seq``) when recorded.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md there): with S the message size in bytes, t the
time and n the group size, ``algbw = S / t`` and ``busbw = algbw * factor``; factor 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and
send/recv. S is the larger of the input and output buffer (all-gather: the gathered output;
reduce-scatter: the input), as nccl-tests sizes them. t is the kernel's duration on this rank's
device, which includes time spent waiting for the other ranks: see :func:`match_ranks`.
"""
from __future__ import annotations


from typing import Any

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.groups import median
from lmprof.trace.launches import launch_columns
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import enclosing
from lmprof.trace.records import Record

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
}  # fmt: skip

# kind -> bus bandwidth factor as a function of the group size (nccl-tests' conventions)
_FACTORS = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
_NOT_COLLECTIVES = {"wait", "barrier_wait", ""}


def collective_kind(name: str) -> str:
    """A collective's kind, normalised: ``all_reduce``/``allreduce_coalesced`` -> ``allreduce``, ..."""
    k = name.strip().lower().lstrip("_")
    for suffix in ("_coalesced", "_into_tensor", "_tensor", "_base", "_single"):
        k = k.replace(suffix, "")
    k = k.replace("all_", "all").replace("-", "_")
    if k in ("alltoallv", "allto_all", "alltoall_v", "allto_allv"):
        k = "alltoall"
    if k == "reducescatter":
        k = "reduce_scatter"
    return k


def kind_from_kernel(name: str) -> str:
    """Kind guessed from an NCCL kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` -> allreduce)."""
    low = name.lower()
    for key, kind in (("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reduce_scatter"),
                      ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("sendrecv", "sendrecv"),
                      ("send", "send"), ("recv", "recv"), ("reduce", "reduce")):  # fmt: skip
        if key in low:
            return kind
    return "unknown"


class Collective(Record, frozen=True):
    """One collective call (one communication kernel). Bytes and bandwidths None when unknown."""

    row: int  # the kernel's row in the events table
    kind: str
    process_group: str
    seq: int  # collective sequence number (-1 when not recorded)
    dtype: str
    group_size: int | None
    message_bytes: int | None
    start_us: float
    time_us: float  # kernel duration on this rank
    algbw_gbps: float | None  # GB/s = 1e9 bytes/s
    busbw_gbps: float | None


class CollectiveGroup(Record, frozen=True):
    """Collectives of one kind, dtype, group size and message size."""

    kind: str
    dtype: str
    group_size: int | None
    message_bytes: int | None
    count: int
    total_us: float
    median_us: float
    algbw_median_gbps: float | None
    busbw_median_gbps: float | None


class Communication(Record, frozen=True):
    """All collectives of one rank's device window."""

    collectives: int
    with_size: int  # of them, with message size and group size known
    source: str  # where the parameters came from: "kernel args" | "record_param_comms" | "kernel names" | mixed
    groups: list[CollectiveGroup]
    calls: list[Collective]


def collectives(table: TraceTable, rows: np.ndarray) -> Communication | None:
    """The collectives among the device ``rows`` (None when there is no communication kernel)."""
    ev = table.event_cols
    types = kinds.kernel_types(table, rows)
    comm_rows = rows[types == kinds.COMMUNICATION]
    if comm_rows.size == 0:
        return None
    params = table.comm_cols
    p_rows = params["row"]
    has_params = np.isin(comm_rows, p_rows)
    rt = launch_columns(table, comm_rows, ["runtime"])["runtime"]
    is_param_op = np.zeros(len(ev), dtype=bool)
    named = np.array([collective_kind(c) not in _NOT_COLLECTIVES for c in params["collective"].tolist()], dtype=bool)
    is_param_op[p_rows[named]] = True
    around = enclosing(table, rt, is_param_op)
    labels, codes = ev.labels("name"), ev["name"]
    ts, dur = ev["ts"], table.durations()
    # an event's parameters: its first row in the table (rows are sorted)
    first_of: dict[int, int] = {}
    for i, r in enumerate(p_rows.tolist()):
        first_of.setdefault(r, i)
    calls, sources = [], set()
    for i, row in enumerate(comm_rows.tolist()):
        src_row = row if has_params[i] else int(around[i])
        if src_row >= 0:
            j = first_of[src_row]
            sources.add("kernel args" if has_params[i] else "record_param_comms")
            kind = collective_kind(str(params["collective"][j]))
            dtype, n = str(params["dtype"][j]), int(params["group_size"][j])
            elems = max(int(params["in_nelems"][j]), int(params["out_nelems"][j]))
            size = DTYPE_BYTES.get(dtype.lower())
            msg = elems * size if size is not None and elems >= 0 else None
            group, seq = str(params["pg_name"][j]), int(params["coll_seq"][j])
        else:
            sources.add("kernel names")
            kind, dtype, n, msg, group, seq = kind_from_kernel(str(labels[codes[row]])), "", -1, None, "", -1
        t = float(dur[row])
        algbw = busbw = None
        n_ok = n if n and n > 0 else None
        if msg is not None and t > 0:
            algbw = msg / t / 1e3  # bytes/us -> GB/s
            factor = _FACTORS.get(kind)
            busbw = algbw * factor(n_ok) if factor is not None and n_ok else None
        calls.append(Collective(row, kind, group, seq, dtype, n_ok, msg, float(ts[row]), t, algbw, busbw))
    return Communication(
        collectives=len(calls),
        with_size=sum(c.message_bytes is not None and c.group_size is not None for c in calls),
        source=" + ".join(sorted(sources)),
        groups=_groups(calls),
        calls=calls,
    )


def _groups(calls: list[Collective]) -> list[CollectiveGroup]:
    by: dict[tuple[Any, ...], list[Collective]] = {}
    for c in calls:
        by.setdefault((c.kind, c.dtype, c.group_size, c.message_bytes), []).append(c)
    out = []
    for (kind, dtype, n, msg), cs in by.items():
        t = np.array([c.time_us for c in cs])
        alg = [c.algbw_gbps for c in cs if c.algbw_gbps is not None]
        bus = [c.busbw_gbps for c in cs if c.busbw_gbps is not None]
        out.append(CollectiveGroup(kind, dtype, n, msg, len(cs), float(t.sum()), median(t),
                                   median(alg) if alg else None,
                                   median(bus) if bus else None))  # fmt: skip
    out.sort(key=lambda g: -g.total_us)
    return out


class RankComm(Record, frozen=True):
    """One rank's matched collectives: time waiting for the slowest rank vs transferring."""

    rank: int
    matched: int
    time_us: float  # summed kernel time of the matched collectives on this rank
    wait_us: float  # of it, waiting for the last rank to arrive
    transfer_us: float  # of it, transferring (= time_us - wait_us)
    wait_pct: float | None


class CommMatch(Record, frozen=True):
    """Collectives matched across ranks, and per rank the wait / transfer split.

    Matching key: (process group, kind, sequence number) when every rank recorded sequence numbers,
    else (process group, kind, n-th call of that kind in that group). A collective ends on every
    rank at about the same time, once the last rank has arrived, and the last rank to arrive waits
    for no one, so the shortest duration across ranks is the transfer time and each rank's excess
    over it is waiting. Durations only are compared, so unsynchronised clocks do not matter.
    """

    matched: int  # collectives present on every rank
    unmatched: int  # collectives present on some ranks only (left out)
    match_by: str  # "sequence number" | "order"
    ranks: list[RankComm]


def matched_by_seq(comms: list[Communication]) -> bool:
    """Collectives are matched across ranks by sequence number when every call has one, else by order."""
    return all(all(x.seq >= 0 for x in c.calls) for c in comms)


def call_keys(comm: Communication, by_seq: bool) -> list[tuple[Any, ...]]:
    """The cross-rank identity of each call: (process group, kind, sequence number or k-th call)."""
    seen: dict[tuple[Any, ...], int] = {}
    out = []
    for x in comm.calls:
        base = (x.process_group, x.kind)
        if by_seq:
            out.append((*base, x.seq))
        else:
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.append((*base, k))
    return out


def match_ranks(per_rank: list[tuple[int, Communication | None]]) -> CommMatch | None:
    """Match the collectives of several ranks (None when fewer than two ranks communicate)."""
    comms = [(r, c) for r, c in per_rank if c is not None and c.calls]
    if len(comms) < 2:
        return None
    by_seq = matched_by_seq([c for _, c in comms])
    keyed: list[dict[tuple[Any, ...], float]] = []
    for _, c in comms:
        keys: dict[tuple[Any, ...], float] = {}
        for x, key in zip(c.calls, call_keys(c, by_seq)):
            keys[key] = keys.get(key, 0.0) + x.time_us  # one collective may run as several kernels
        keyed.append(keys)
    common = set(keyed[0]).intersection(*keyed[1:])
    every = set().union(*keyed)
    shortest = {k: min(d[k] for d in keyed) for k in common}
    rows = []
    for (rank, _), d in zip(comms, keyed):
        time = sum(d[k] for k in common)
        wait = sum(d[k] - shortest[k] for k in common)
        rows.append(RankComm(rank, len(common), time, wait, time - wait, 100.0 * wait / time if time > 0 else None))
    return CommMatch(len(common), len(every) - len(common), "sequence number" if by_seq else "order", rows)
