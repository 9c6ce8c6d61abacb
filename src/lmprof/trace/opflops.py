"""FLOPs and bytes of each CPU operator from its recorded input shapes (``record_shapes=True``).

For the common operators the count is a formula over the shapes in ``TraceTable.shapes``:

* ``aten::mm`` ``[m,k]@[k,n]``, ``aten::addmm`` (bias, a, b): ``2·m·k·n``;
* ``aten::bmm`` / ``aten::baddbmm`` ``[b,m,k]@[b,k,n]``: ``2·b·m·k·n``;
* ``aten::matmul``: as bmm over the broadcast batch (a 1-D operand is a row or a column);
* ``aten::linear`` ``x[..., k]``, ``w[n, k]``: ``2·rows(x)·k·n``;
* scaled-dot-product attention, every variant (the composite, flash, efficient, cuDNN, the CPU
  kernel): ``q[b,h,s,d]``, ``k[b,hk,t,d]``, ``v[b,hk,t,dv]``: ``2·b·h·s·t·(d + dv)``; their backward
  (grad_out, q, k, v first): ``2·b·h·s·t·(3·d + 2·dv)``. Like ``torch.utils.flop_counter``, the
  causal mask is not taken off;
* elementwise operators (``aten::add``, ``mul``, ``gelu``, ...): one FLOP per output element.

A multiply-add is 2 FLOPs and the bias add of addmm/linear is not counted: the conventions of
``torch.utils.flop_counter.FlopCounterMode``, which the tests check every formula against on the
same shapes. Bytes are the least traffic: every tensor the call reads, read once, and its result
written once, at the dtypes the trace names. Which inputs are read comes from torch's operator
schemas (:mod:`lmprof.trace.op_roles`, generated from them): a trace names ``aten::mul``, not the
overload, so the overloads that fit the call's input count and types say it. The ``out=`` tensor of
``mul.out(self, other, *, out)`` (three inputs) is written, not read: the result is written at its
dtype, with the formula's dims (the recorded ones may be an empty tensor the call resizes).
A composite operator (``aten::linear``, ``aten::matmul``) holds the
operator that does the work (``aten::addmm``, ``aten::mm``): both get the count, and totals count
only the outermost one.

Time: on a trace with device work, the device time of the kernels each operator launched (itself
or through the operators inside it); on a CPU-only trace, the operator's own duration. Achieved
FLOP/s and bytes/s are count over that time. Placing an operator against a device's peaks is left to
:mod:`lmprof.analysis.op_roofline` (this layer knows no devices).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.launches import launch_links
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import parents
from lmprof.trace.op_roles import ROLES
from lmprof.trace.records import Record

Dims = tuple[int, ...]
Counter = Callable[[list[Any]], "tuple[int, Dims] | None"]  # tensor dims -> (FLOPs, output dims)

# element width of the dtype names record_shapes writes (c10's names)
TYPE_BYTES: dict[str, int] = {
    "double": 8, "float": 4, "c10::Half": 2, "long": 8, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}  # fmt: skip
# the compute dtype (lmprof.dtypes' short names) a device peak is looked up by
TYPE_DTYPE: dict[str, str] = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
}  # fmt: skip


def _numel(d: Dims) -> int:
    return math.prod(d)


def _mm(t: list[Any]) -> tuple[int, Dims] | None:
    a, b = t[0], t[1]
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 2 * a[0] * a[1] * b[1], (a[0], b[1])


def _bmm(t: list[Any]) -> tuple[int, Dims] | None:
    a, b = t[0], t[1]
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        return None
    return 2 * a[0] * a[1] * a[2] * b[2], (a[0], a[1], b[2])


def _broadcast(*shapes: Dims) -> Dims | None:
    """numpy / torch broadcasting of shapes; None when they do not broadcast."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(n):
        sizes = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _matmul(t: list[Any]) -> tuple[int, Dims] | None:
    a, b = t[0], t[1]
    if not a or not b:
        return None
    a2 = (1, a[0]) if len(a) == 1 else a
    b2 = (b[0], 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    batch = _broadcast(a2[:-2], b2[:-2])
    if batch is None:
        return None
    m, k, n = a2[-2], a2[-1], b2[-1]
    out = batch + ((m,) if len(a) > 1 else ()) + ((n,) if len(b) > 1 else ())
    return 2 * _numel(batch) * m * k * n, out


def _linear(t: list[Any]) -> tuple[int, Dims] | None:
    x, w = t[0], t[1]
    if not x or len(w) != 2 or x[-1] != w[1]:
        return None
    return 2 * _numel(x[:-1]) * w[1] * w[0], x[:-1] + (w[0],)


def _from(i: int, count: Counter) -> Counter:
    return lambda t: count(t[i:]) if len(t) > i else None  # ops whose first input is a bias


def _attention(t: list[Any]) -> tuple[int, Dims] | None:
    q, k, v = t[0], t[1], t[2]
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[3] != k[3] or k[2] != v[2]:
        return None
    b, h, s, d = q
    return 2 * b * h * s * k[2] * (d + v[3]), (b, h, s, v[3])


def _attention_backward(t: list[Any]) -> tuple[int, Dims] | None:
    if len(t) < 4 or _attention(t[1:4]) is None:
        return None
    q, k, v = t[1], t[2], t[3]
    return 2 * q[0] * q[1] * q[2] * k[2] * (3 * q[3] + 2 * v[3]), q  # out: grad of q (k, v: not counted)


def _elementwise(t: list[Any]) -> tuple[int, Dims] | None:
    out = _broadcast(*t) if t else None
    return None if out is None else (_numel(out), out)


_ATTENTION = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_fused_attention_overrideable")  # fmt: skip
# (aten::_flash_attention_forward and _efficient_attention_forward take q, k, v as [b, s, h, d]: they run
# inside the _scaled_dot_product_* operators above, which carry the count)
_ELEMENTWISE = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
                "gelu", "silu", "pow", "abs", "sin", "cos", "maximum", "minimum", "clamp", "reciprocal",
                "addcmul", "addcdiv", "lerp", "where", "masked_fill", "threshold_backward", "gelu_backward",
                "silu_backward", "sigmoid_backward", "tanh_backward")  # fmt: skip

COUNTERS: dict[str, Counter] = {
    "aten::mm": _mm,
    "aten::addmm": _from(1, _mm),
    "aten::bmm": _bmm,
    "aten::baddbmm": _from(1, _bmm),
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    **{f"aten::{n}": _attention for n in _ATTENTION},
    **{f"aten::{n}_backward": _attention_backward for n in _ATTENTION[1:]},
    **{f"aten::{n}": _elementwise for n in _ELEMENTWISE},
    **{f"aten::{n}_": _elementwise for n in _ELEMENTWISE},  # in place: same count
}


# Which inputs of a call are read and which written. A trace names the operator, not its overload:
# the overloads whose schema (op_roles, generated from torch's) fits the call's inputs give each
# input its role. An out= tensor (``mul.out``'s last input) is written, not read, and its recorded
# dims may be the empty tensor torch resizes; an in-place ``self`` is read and written.
READ, WRITTEN, IN_PLACE, OTHER = "r", "w", "m", "-"
# overloads no formula above describes: ``where(condition)`` is nonzero(), not an elementwise select
_NOT_COUNTED = frozenset({("aten::where", "")})


def _is_tensor(kind: str) -> bool:
    """Whether a recorded input type names a tensor's dtype: c10's dtype names (``float``,
    ``long int``, ``c10::Half``) start lower-case, the profiler's other kinds (``Scalar``,
    ``ScalarList``, ``TensorList``) upper-case, and an absent value or a string is ``""``."""
    return kind[:1].islower()


def _fits(letter: str, kind: str | None) -> bool:
    """Whether an input recorded with type ``kind`` can be an argument of role ``letter``."""
    if kind is None:  # no type recorded for this input: any role
        return True
    if letter == OTHER:
        return not _is_tensor(kind)
    if letter == WRITTEN:
        return _is_tensor(kind)  # an out= tensor is always given
    return kind == "" or _is_tensor(kind)  # read: an optional tensor may be absent


def input_roles(name: str, types: tuple[str | None, ...]) -> tuple[str, frozenset[str]] | None:
    """The role of each input of one call of ``name`` with these recorded input types (one letter
    per input: ``r`` read, ``w`` written and not read (out=), ``m`` read and written (in place),
    ``-`` no tensor) and the overloads that fit it; None when two overloads that fit give a
    recorded tensor different roles, or none fits and the operator has an out= overload.

    When none fits (a trace from a torch whose schema had fewer arguments: ``enable_gqa`` of
    ``scaled_dot_product_attention`` is recent) an operator without out= overloads writes no input
    it is given: its tensors are read, and the set of overloads is empty."""
    overloads = ROLES.get(name, {})
    got: str | None = None
    fit = []
    for overload, letters in overloads.items():
        if len(letters) != len(types) or not all(_fits(c, k) for c, k in zip(letters, types)):
            continue
        # an input recorded as no tensor has no role, whatever the overload's schema says of it
        roles = "".join(c if k is None or _is_tensor(k) else OTHER for c, k in zip(letters, types))
        if got is not None and roles != got:
            return None
        got = roles
        fit.append(overload)
    if got is None and overloads and not any(WRITTEN in letters for letters in overloads.values()):
        got = "".join(READ if k is None or _is_tensor(k) else OTHER for k in types)
    return None if got is None else (got, frozenset(fit))


class OpCost(Record, frozen=True):
    """One operator call's FLOPs, least bytes and compute dtype (None: unknown width or dtype)."""

    flops: int
    bytes: int | None
    dtype: str | None


def op_cost(name: str, dims: tuple[Any, ...], types: tuple[str, ...]) -> OpCost | None:
    """FLOPs and bytes of one call of ``name`` with these recorded shapes, or None when no formula
    applies (an operator not covered, an overload that fits no schema of it or that no formula
    describes, a tensor list, shapes that do not fit the operator).

    The formula sees the tensors read; bytes are those tensors read once and the output written
    once, at the width of the tensor written (an out= or in-place one) or else of the dtype it
    computes in (:func:`_lead_type`); None when a width is not known or the call writes more than
    one tensor."""
    count = COUNTERS.get(name)
    if count is None:
        return None
    recorded = tuple(types[i] if i < len(types) else None for i in range(len(dims)))  # None: not recorded
    found = input_roles(name, recorded)
    if found is None or any((name, o) in _NOT_COUNTED for o in found[1]):
        return None
    roles = found[0]
    tensors: list[Dims] = []
    widths: list[int | None] = []
    read_types: list[str | None] = []
    written: list[str | None] = []  # the types of the tensors written
    for d, kind, role in zip(dims, recorded, roles):
        # scalars and absent optionals are no tensors (role "-"); a 0-d tensor is (), numel 1
        if d is None or (d and isinstance(d[0], tuple)) or role == OTHER:
            continue
        if role in (WRITTEN, IN_PLACE):
            written.append(kind)
        if role == WRITTEN:  # its dims are not read (and may be an empty tensor torch resizes)
            continue
        tensors.append(d)
        read_types.append(kind)
        widths.append(TYPE_BYTES.get(kind or ""))
    try:
        got = count(tensors)
    except IndexError:  # fewer tensor inputs than the operator takes
        return None
    if got is None:
        return None
    flops, out = got
    # where's condition (its first input in every overload) is no value of its result
    skip = 1 if name == "aten::where" else 0
    lead = _lead_type(tensors[skip:], read_types[skip:])
    if written:  # the output is that tensor: its dtype is recorded, its dims may be stale
        out_width = TYPE_BYTES.get(written[0] or "") if len(written) == 1 else None
    else:
        out_width = TYPE_BYTES[lead] if lead else None
    nbytes: int | None = None
    if tensors and all(w is not None for w in widths) and out_width is not None:
        nbytes = sum(_numel(d) * w for d, w in zip(tensors, widths) if w is not None) + _numel(out) * out_width
    return OpCost(flops, nbytes, TYPE_DTYPE.get(lead) if lead else None)


def _lead_type(tensors: list[Dims], types: list[str | None]) -> str | None:
    """The dtype a call computes in (and, unless it writes a given tensor, writes its result in),
    from the tensors it reads that are values of its result: of the first floating-point one that
    has dims, else of the first floating-point one, else of the first of a known width. Under
    torch's type promotion a 0-d tensor (often a Python number: ``aten::mul [[], [m, n]]``, double
    and float, computes in float) does not change a dimensioned tensor's floating dtype."""
    floats = [(d, t) for d, t in zip(tensors, types) if t in TYPE_DTYPE]
    got = next((t for d, t in floats if d), None) or next((t for _, t in floats), None)
    return got or next((t for t in types if t in TYPE_BYTES), None)


class OpFlopsRow(Record, frozen=True):
    """One operator with one set of input shapes, over all its calls."""

    name: str
    shapes: str  # the recorded input dims, as torch's key_averages(group_by_input_shape=True) shows them
    dtype: str | None  # compute dtype (fp32, bf16, ...): of its first floating tensor read with dims
    count: int
    flops: int  # per call
    bytes: int | None  # per call, least traffic
    time_us: float  # all calls: device time of their kernels, or their CPU duration (``time_source``)
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    intensity_flop_per_byte: float | None
    nested: bool  # inside another counted operator (aten::mm in aten::matmul): left out of totals


class OpFlops(Record, frozen=True):
    """Per-op FLOPs and bytes of a trace recorded with ``record_shapes``."""

    time_source: str  # "device" (kernels each op launched) or "cpu" (op durations, CPU-only trace)
    ops_with_shapes: int  # operator calls with recorded shapes
    counted: int  # calls a formula applied to
    total_flops: int  # outermost counted calls only
    total_bytes: int
    total_time_us: float
    rows: list[OpFlopsRow]  # by time, the ``top`` largest


def _device_time(table: TraceTable, ops: np.ndarray) -> np.ndarray | None:
    """Device time of the kernels each event launched, itself or through the events inside it."""
    dev = kinds.device_mask(table)
    if not dev.any():
        return None
    links = launch_links(table)
    op = links["op"]
    ok = op >= 0
    dur = table.event_cols["dur"][links["event"][ok]]
    cur = op[ok]
    acc = np.zeros(len(table.event_cols))
    parent = parents(table)
    while cur.size:
        np.add.at(acc, cur, dur)
        cur = parent[cur]
        keep = cur >= 0
        cur, dur = cur[keep], dur[keep]
    return acc


def _shape_text(dims: tuple[Any, ...]) -> str:
    def one(d: Any) -> str:
        if d is None:
            return "?"
        if d and isinstance(d[0], tuple):
            return "[" + ", ".join(one(x) for x in d) + "]"
        return "[" + ", ".join(str(x) for x in d) + "]"

    return "[" + ", ".join(one(d) for d in dims) + "]"


def op_flops(table: TraceTable, top: int = 10) -> OpFlops | None:
    """FLOPs, bytes, achieved FLOP/s and bytes/s per operator and input shapes; None without shapes."""
    sh = table.shape_cols
    if sh.empty:
        return None
    names = table.event_cols.labels("name")
    rows = sh["row"]
    # one formula per distinct (name, shapes): a key per call, numbered by first call (as a dict
    # filled call by call would be, so the rows of equal time keep that order)
    name_codes = table.event_cols["name"][rows].astype(np.int64)
    keys = name_codes * (int(sh["shape"].max()) + 1) + sh["shape"]
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(by_first.size)
    group = rank[inverse.reshape(-1)]  # each call's key, numbered by first call
    firsts = first[by_first].tolist()
    costs = [op_cost(str(names[name_codes[i]]), sh["dims"][i], sh["types"][i]) for i in firsts]
    hit = np.array([c is not None for c in costs], dtype=bool)[group]
    if not hit.any():
        return OpFlops("cpu", len(rows), 0, 0, 0, 0.0, [])
    counted = rows[hit]
    device = _device_time(table, counted)
    source = "cpu" if device is None else "device"
    times = table.event_cols["dur"][counted] if device is None else device[counted]
    # outermost: no counted operator among the ancestors
    is_counted = np.zeros(len(table.event_cols), dtype=bool)
    is_counted[counted] = True
    parent = parents(table)
    nested = np.zeros(counted.size, dtype=bool)
    cur = parent[counted]
    while True:
        live = cur >= 0
        if not live.any():
            break
        nested |= live & is_counted[np.where(live, cur, 0)]
        cur = np.where(live, parent[np.where(live, cur, 0)], -1)
    # the counted calls of each key, in call order, keys by first call
    cgroup = group[hit]
    order = np.argsort(cgroup, kind="stable")
    starts = np.flatnonzero(np.r_[True, cgroup[order][1:] != cgroup[order][:-1]])
    out: list[OpFlopsRow] = []
    total_flops = total_bytes = 0
    total_time = 0.0
    for idx in np.split(order, starts[1:]):
        g = int(cgroup[idx[0]])
        c = costs[g]
        assert c is not None
        n = len(idx)
        t = float(times[idx].sum())
        inner = bool(nested[idx].all())
        if not inner:
            outer = int((~nested[idx]).sum())
            total_flops += c.flops * outer
            total_bytes += (c.bytes or 0) * outer
            total_time += float(times[idx][~nested[idx]].sum())
        secs = t * 1e-6
        i = firsts[g]
        out.append(OpFlopsRow(
            name=str(names[name_codes[i]]), shapes=_shape_text(sh["dims"][i]), dtype=c.dtype, count=n, flops=c.flops,
            bytes=c.bytes,
            time_us=t,
            achieved_flops_per_s=c.flops * n / secs if secs > 0 else None,
            achieved_bytes_per_s=c.bytes * n / secs if secs > 0 and c.bytes is not None else None,
            intensity_flop_per_byte=c.flops / c.bytes if c.bytes else None,
            nested=inner,
        ))  # fmt: skip
    out.sort(key=lambda r: (-r.time_us, -r.flops * r.count, r.name, r.shapes))
    return OpFlops(source, len(rows), int(hit.sum()), total_flops, total_bytes, total_time, out[:top])
