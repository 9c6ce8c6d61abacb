"""Decoding one run of trace events (a JSON list) into columns: a pure function of its bytes.

msgspec decodes the events into small typed structs (``_Event``, ``Args``: built from the fields
of :mod:`lmprof.trace.kineto.schema`); complete
(``ph: X``) events, flow events and the allocator's ``[memory]`` instants then become numpy columns
with names, categories and text ids coded locally (:class:`Chunk`). Because a chunk depends on
nothing else, chunks can be decoded in worker processes and merged in file order
(:mod:`lmprof.trace.kineto.columns`). An event that cannot be read costs only itself (:func:`decode_chunk`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable

import msgspec
import numpy as np

from lmprof.trace.fields import HW_COLUMNS, ID_COLUMNS
from lmprof.trace.kineto import schema
from lmprof.trace.kineto.split import list_items


def _arg(f: schema.Field, kind: Any, default: Any) -> tuple[str, Any, Any]:
    return f.name, kind, msgspec.field(default=default, name=f.key)


# The args an event may carry that lmprof reads (others are skipped by the decoder), built from the
# schema: ids as int | str | None (-1 when absent); kernel resources, collective parameters and
# allocator fields as Any (an odd value there must never cost the event); the shapes as their raw
# JSON (each distinct one is decoded once, parse_shapes).
Args: Any = msgspec.defstruct(
    "Args",
    [_arg(f, int | str | None, -1) for f in schema.ID_ARGS]
    + [_arg(f, Any, None) for f in schema.NUMBER_ARGS + schema.COMM_ARGS + schema.MEMORY_ARGS]
    + [_arg(f, msgspec.Raw, msgspec.Raw()) for f in schema.SHAPE_ARGS],
    gc=False,
    module=__name__,
)
NO_ARGS = Args()
COMM_FIELDS = tuple(f.name for f in schema.COMM_ARGS)
HW_FIELDS = HW_COLUMNS  # kernel resources and copy sizes, float64 columns
_MEM_FIELDS = tuple(f.name for f in schema.MEMORY_ARGS)
_DIMS, _TYPES = (attrgetter(f.name) for f in schema.SHAPE_ARGS)
_MEMORY_EVENT = "[memory]"
_INSTANT_PHASES = ("i", "I")
_FLOW_PHASES = ("s", "t", "f")

# One trace event (its top-level keys: schema.EVENT_FIELDS, "args" the struct above).
_Event: Any = msgspec.defstruct(
    "_Event",
    [(f.key, Args | None if f.key == "args" else f.types, f.default) for f in schema.EVENT_FIELDS],
    gc=False,
    module=__name__,
)
EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_EVENT_DECODER = msgspec.json.Decoder(_Event)
# What a decoder raises on input it cannot read: bad JSON or types, invalid UTF-8 in a string, and
# nesting deeper than the decoder's recursion limit (e.g. 100,000 nested arrays in args).
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
MAX_INT = 2**63

_get = {k: attrgetter(k) for k in schema.EVENT_KEYS}
ARG_COLUMNS = ID_COLUMNS  # args kept as int64 columns
_get_arg = {k: attrgetter(k) for k in ARG_COLUMNS}
_get_collective = attrgetter(schema.COMM_ARGS[0].name)
_get_comm_fields = attrgetter(*COMM_FIELDS)
_get_mem_fields = attrgetter(*_MEM_FIELDS)
_HW_GETTERS = {f: attrgetter(f) for f in HW_FIELDS}
# categories whose events carry kernel resources or copy sizes
HW_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
# categories whose events carry input shapes (record_shapes): CPU operators, new and old name
SHAPE_CATS = frozenset({"cpu_op", "operator"})
# Bounds on what one operator's shapes may hold: beyond them the shapes are junk (or hostile) and the
# event is kept without shapes, so a trace of 1 M ops cannot make the table grow without limit.
MAX_INPUTS = 64  # inputs per operator
MAX_RANK = 16  # dimensions per tensor
MAX_LIST = 64  # tensors per TensorList input (aten::cat)
MAX_DIM = 2**48  # elements along one dimension
MAX_TYPE = 64  # characters of one dtype name


@dataclass
class Coded:
    """Values of an id column that are not 64-bit integers ("Spans", "0x1f", ...): rows and text."""

    rows: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class Chunk:
    """One run of events decoded on its own: columns with codes local to the chunk.

    A chunk depends on nothing but its bytes, so chunks can be decoded in any process and in any
    order; :class:`Merger` then maps the local codes (names, categories, phases, text ids) to the
    trace's and appends the columns in file order.
    """

    n_raw: int = 0  # events decoded
    nbytes: int = 0  # bytes of the JSON list they were decoded from
    skipped: int = 0  # list items that could not be read as events
    repaired_utf8: int = 0  # events read after replacing invalid UTF-8
    first_problem: str | None = None
    out_of_range: dict[str, int] = field(default_factory=dict)  # field -> odd integers read as absent
    names: list[Any] = field(default_factory=list)  # local code -> name
    cats: list[Any] = field(default_factory=list)
    phs: list[Any] = field(default_factory=list)
    x: dict[str, np.ndarray] = field(default_factory=dict)  # complete events' columns
    x_coded: dict[str, Coded] = field(default_factory=dict)
    fl: dict[str, np.ndarray] = field(default_factory=dict)  # flow events' columns
    fl_coded: dict[str, Coded] = field(default_factory=dict)
    comm_rows: list[int] = field(default_factory=list)  # complete-event rows with collective parameters
    comm_values: list[tuple[Any, ...]] = field(default_factory=list)
    # operator rows with input shapes, and the code of each one's (dims, types) in shape_values (the
    # distinct ones, in order of first appearance; see shape_fields)
    shape_rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    shape_codes: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    shape_values: list[tuple[Any, Any]] = field(default_factory=list)
    hw_rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    hw_cols: dict[str, np.ndarray] = field(default_factory=dict)  # float64, see hw_values
    memory: list[tuple[Any, ...]] = field(default_factory=list)  # [memory] events: ts, pid, tid + _MEM_FIELDS


def decode_chunk(payload: bytes | memoryview, exact: bool) -> Chunk:
    """Decode one JSON list of events into a :class:`Chunk`.

    Not ``exact``: decoding errors propagate (the splitter judges its guessed cut by them).
    ``exact``: when the list as a whole cannot be decoded, each event is decoded on its own and the
    ones that still fail are skipped and counted (see :func:`_one_by_one`).
    """
    ch = Chunk()
    try:
        events = EVENTS_DECODER.decode(payload)
    except DECODE_ERRORS:
        if not exact:
            raise
        events = _one_by_one(payload, ch)
    ch.n_raw = len(events)
    xs = [e for e in events if e.ph == "X"]
    fl = [e for e in events if e.ph in _FLOW_PHASES]
    mem = [e for e in events if e.name == _MEMORY_EVENT and e.ph in _INSTANT_PHASES]
    del events
    names: dict[Any, int] = {}
    cats: dict[Any, int] = {}
    if xs:
        _complete_columns(ch, xs, names, cats)
    if fl:
        phs: dict[Any, int] = {}
        ch.fl = {
            "id": _ints(ch, xs=fl, get=_get["id"], none=-1, field="id", coded=ch.fl_coded),
            "ph": _codes(phs, list(map(_get["ph"], fl))),
            "cat": _codes(cats, list(map(_get["cat"], fl))),
            "pid": _ints(ch, fl, _get["pid"], none=0, field="pid", coded=ch.fl_coded),
            "tid": _ints(ch, fl, _get["tid"], none=0, field="tid", coded=ch.fl_coded),
            "ts": _floats(fl, _get["ts"]),
        }
        ch.phs = list(phs)
    if mem:
        ch.memory = memory_rows(mem)
    ch.names, ch.cats = list(names), list(cats)
    return ch


def _complete_columns(ch: Chunk, xs: list[Any], names: dict[Any, int], cats: dict[Any, int]) -> None:
    name_codes = _codes(names, list(map(_get["name"], xs)))
    cat_codes = _codes(cats, list(map(_get["cat"], xs)))
    args = list(map(_get["args"], xs))
    if None in args:
        args = [a if a is not None else NO_ARGS for a in args]
    x = {
        "name": name_codes,
        "cat": cat_codes,
        "pid": _ints(ch, xs, _get["pid"], none=0, field="pid", coded=ch.x_coded),
        "tid": _ints(ch, xs, _get["tid"], none=0, field="tid", coded=ch.x_coded),
        "ts": _floats(xs, _get["ts"]),
        "dur": _floats(xs, _get["dur"]),
    }
    for key, get in _get_arg.items():
        x[key] = _ints(ch, args, get, none=-1, field=f"args.{key}", coded=None)
    ch.x = x
    # sparse args: only events that can carry them are looked at (by name / category code)
    comm_codes = [c for n, c in names.items() if may_carry_comms(n)]
    for i in np.flatnonzero(np.isin(name_codes, comm_codes)).tolist():
        if carries_comms(args[i]):
            ch.comm_rows.append(i)
            ch.comm_values.append(comm_fields(args[i]))
    device_codes = [c for k, c in cats.items() if isinstance(k, str) and k.lower() in HW_CATS]
    dev_idx = np.flatnonzero(np.isin(cat_codes, device_codes))
    ch.hw_rows = dev_idx.astype(np.int64)
    dev_args = [args[i] for i in dev_idx.tolist()]
    ch.hw_cols = hw_columns(dev_args)
    raw_pairs: dict[tuple[bytes, bytes | None], int] = {}
    rows, pairs = [], []
    for i in np.flatnonzero(np.isin(cat_codes, shape_cat_codes(list(cats)))).tolist():
        dims = bytes(_DIMS(args[i]))
        if dims and dims != b"null":  # absent or null: no shapes
            types = bytes(_TYPES(args[i]))
            rows.append(i)
            pairs.append(raw_pairs.setdefault((dims, types if types and types != b"null" else None), len(raw_pairs)))
    if rows:
        keys = list(raw_pairs)
        add_shapes(ch, np.array(rows, dtype=np.int64), np.array(pairs, dtype=np.int64), keys.__getitem__)


def shape_cat_codes(cats: list[Any]) -> list[int]:
    """Local codes of the categories whose events may carry input shapes."""
    return [c for c, k in enumerate(cats) if isinstance(k, str) and k.lower() in SHAPE_CATS]


def add_shapes(
    ch: Chunk, rows: np.ndarray, pairs: np.ndarray, raw: Callable[[int], tuple[bytes, bytes | None]]
) -> None:
    """Keep the input shapes of operator ``rows``: row i's ``"Input Dims"`` and ``"Input type"`` are
    the raw JSON ``raw(pairs[i])`` (types None when absent). Each distinct pair is decoded once
    (:func:`parse_shapes`), and equal shapes get one code, numbered in order of first appearance:
    both readers call this, so they give the same codes."""
    if not rows.size:
        return
    uniq, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    values: dict[tuple[Any, Any], int] = {}
    local = np.full(len(uniq), -1, dtype=np.int32)
    for u in np.argsort(first, kind="stable").tolist():
        got = parse_shapes(*raw(int(uniq[u])))
        if got is not None:
            local[u] = values.setdefault(got, len(values))
    codes = local[inverse.reshape(-1)]
    keep = codes >= 0
    ch.shape_rows, ch.shape_codes, ch.shape_values = rows[keep], codes[keep], list(values)


_ANY = msgspec.json.Decoder()
# The cache of decoded shapes holds at most _CACHED pairs of at most _CACHED_RAW bytes of text: real
# traces have a few thousand distinct pairs (630 to 2,099 in HTA's, 99% under 500 bytes), and a
# hostile file of all-different, long shapes costs the cache some tens of MB, not more.
_CACHED = 4096
_CACHED_RAW = 2048


def parse_shapes(dims: bytes, types: bytes | None) -> tuple[Any, Any] | None:
    """One operator's shapes from the raw JSON of its ``"Input Dims"`` and ``"Input type"`` (None:
    absent): :func:`shape_fields` of the decoded values, or None when unusable or undecodable.

    Equal raw text recurs from layer to layer and step to step, so the answer is kept (across
    chunks and threads, for as many pairs as real traces have: see _CACHED), and equal shapes
    are one tuple."""
    if len(dims) + len(types or b"") > _CACHED_RAW:  # a hostile file's: not kept
        return _parse_shapes(dims, types)
    return _parse_shapes_cached(dims, types)


def _parse_shapes(dims: bytes, types: bytes | None) -> tuple[Any, Any] | None:
    try:
        return shape_fields(_ANY.decode(dims), None if types is None else _ANY.decode(types))
    except DECODE_ERRORS:  # e.g. invalid UTF-8, which msgspec does not check in a raw value
        return None


_parse_shapes_cached = functools.lru_cache(maxsize=_CACHED)(_parse_shapes)


def _dims(x: Any) -> tuple[int, ...] | None:
    if x.__class__ is not list or len(x) > MAX_RANK:
        return None
    if any(d.__class__ is not int or not 0 <= d < MAX_DIM for d in x):
        return None
    return tuple(x)


def shape_fields(dims: Any, types: Any) -> tuple[Any, Any] | None:
    """One operator's shapes as hashable values: ``(dims, types)``, or None when unusable.

    ``dims`` holds one entry per input: a tuple of sizes for a tensor (``()`` for a scalar or an
    absent input), a tuple of such tuples for a tensor list, None for anything else. ``types`` holds
    the dtype names (``""`` where not text). Both readers apply this one rule.
    """
    if dims.__class__ is not list or len(dims) > MAX_INPUTS:
        return None
    out: list[Any] = []
    for x in dims:
        d = _dims(x)
        if d is None and x.__class__ is list and 0 < len(x) <= MAX_LIST and all(y.__class__ is list for y in x):
            items = [_dims(y) for y in x]
            d = None if any(y is None for y in items) else tuple(items)  # type: ignore[arg-type]
        out.append(d)
    if types.__class__ is list and len(types) <= MAX_INPUTS:
        names = tuple(t[:MAX_TYPE] if t.__class__ is str else "" for t in types)
    else:
        names = ()
    return tuple(out), names


def memory_rows(mem: list[Any]) -> list[tuple[Any, ...]]:
    """The allocator's events as rows: ts, pid, tid and the memory fields of their args."""
    return [(e.ts, e.pid, e.tid, *_get_mem_fields(e.args or NO_ARGS)) for e in mem]


def carries_comms(args: Any) -> bool:
    """Whether an event's args hold collective parameters (their first field, the collective's name)."""
    return _get_collective(args) is not None


def comm_fields(args: Any) -> tuple[Any, ...]:
    """The collective parameters of one event's args, in COMM_FIELDS order."""
    return tuple(_get_comm_fields(args))


def hw_columns(dev_args: list[Any]) -> dict[str, np.ndarray]:
    """Kernel resources and copy sizes of device events' args, one column per HW_FIELDS name."""
    return {f: hw_values(list(map(get, dev_args))) for f, get in _HW_GETTERS.items()}


_PLAIN_NUMBERS = (int, float, type(None))
HW_MAX = 1e30  # no kernel has this many registers or bytes: larger values are junk


def hw_values(values: list[Any] | np.ndarray) -> np.ndarray:
    """A kernel-resource column as float64: numbers in [0, HW_MAX), NaN for anything else (absent,
    null, negative, text, bools)."""
    if isinstance(values, np.ndarray):
        col = values.astype(np.float64, copy=True)
    else:
        try:
            if any(v.__class__ not in _PLAIN_NUMBERS for v in values):
                raise TypeError  # bools (an int subclass), text, lists: one by one below
            col = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except (TypeError, OverflowError):
            col = np.array([_hw_number(v) for v in values], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        col[~((col >= 0) & (col < HW_MAX))] = np.nan  # NaN compares False: stays NaN
    return col


def _hw_number(v: Any) -> float:
    if v.__class__ not in (int, float):
        return np.nan
    try:
        return float(v)
    except OverflowError:
        return np.nan


def may_carry_comms(name: Any) -> bool:
    """Events that may carry collective parameters: record_param_comms, NCCL/RCCL kernels."""
    low = str(name).lower()
    return "record_param_comms" in low or "nccl" in low or "rccl" in low or "comm" in low


def _one_by_one(payload: bytes | memoryview, ch: Chunk) -> list[Any]:
    """Decode the items of a JSON list one at a time; skip (and count) those that fail.

    Items are found by a bracket scan, so one bad event costs only itself. An item with invalid
    UTF-8 is read again with the bad bytes replaced by U+FFFD (and counted as repaired).
    """
    out: list[Any] = []
    for item in list_items(payload):
        try:
            out.append(_EVENT_DECODER.decode(item))
            continue
        except UnicodeDecodeError:
            try:
                out.append(_EVENT_DECODER.decode(bytes(item).decode("utf-8", "replace").encode()))
                ch.repaired_utf8 += 1
                continue
            except DECODE_ERRORS as exc:
                problem: BaseException = exc
        except DECODE_ERRORS as exc:
            problem = exc
        ch.skipped += 1
        if ch.first_problem is None:
            ch.first_problem = describe(problem)
    return out


def _codes(table: dict[Any, int], values: list[Any]) -> np.ndarray:
    codes = [table.setdefault(v, len(table)) for v in values]
    return np.fromiter(codes, dtype=np.int32, count=len(codes))


def _ints(
    ch: Chunk, xs: list[Any], get: Callable[[Any], Any], none: int, field: str, coded: dict[str, Coded] | None
) -> np.ndarray:
    """An int64 column. ``coded``: text ids are kept (rows and text) for the merger to code; else
    values that are not 64-bit integers count as out of range and read as ``none``."""
    try:
        return np.fromiter(map(get, xs), dtype=np.int64, count=len(xs))
    except (TypeError, ValueError, OverflowError):
        pass
    # Rare values: None, hex strings ("0x0" on ROCm), names as ids ("Spans"), integers outside
    # int64 (>= 2**63); fix only those.
    values = list(map(get, xs))
    for i in [i for i, v in enumerate(values) if v.__class__ is not int or not -MAX_INT <= v < MAX_INT]:
        values[i] = odd_id(ch, values[i], i, none, field, coded)
    return np.array(values, dtype=np.int64)


def odd_id(ch: Chunk, value: Any, row: int, none: int, field: str, coded: dict[str, Coded] | None) -> int:
    """The int64 cell of an id that is not a plain 64-bit integer (None, text, a huge integer).

    Integer text ("42", "0x1f") is read; None and "" are ``none``. Anything else is kept as text
    for the merger to code when ``coded`` is given (the cell holds 0 until then), else it counts as
    out of range in ``ch`` and reads as ``none``. Both readers (msgspec here, the C reader in
    scan.py) apply this one rule.
    """
    parsed = none if value is None or value == "" else parse_int(str(value))
    if parsed is not None:
        return parsed
    if coded is None:
        ch.out_of_range[field] = ch.out_of_range.get(field, 0) + 1
        return none
    c = coded.setdefault(field, Coded())
    c.rows.append(row)
    c.text.append(str(value)[:200])
    return 0  # replaced by the trace-wide code when merged


def parse_int(s: str) -> int | None:
    """An integer written as text ("42", "0x1f", "3.0"), or None when not a 64-bit integer."""
    if len(s) <= 40:  # int() of a huge digit string is slow and never a valid id anyway
        for parse in (lambda: int(s, 0), lambda: int(float(s))):
            try:
                v = parse()
            except (ValueError, OverflowError):
                continue
            if -MAX_INT <= v < MAX_INT:
                return v
            break
    return None


def _floats(items: list[Any], get: Callable[[Any], Any]) -> np.ndarray:
    try:
        out = np.fromiter(map(get, items), dtype=np.float64, count=len(items))
    except (TypeError, ValueError):
        out = np.array([to_float(v) for v in map(get, items)], dtype=np.float64)
    if np.isnan(out).any():  # null timestamps / durations count as 0, like absent ones
        out[np.isnan(out)] = 0.0
    return out


def to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def describe(exc: BaseException) -> str:
    """A one-line reason for an unreadable event."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "invalid UTF-8"
    return " ".join(str(exc).split())[:200] or type(exc).__name__
