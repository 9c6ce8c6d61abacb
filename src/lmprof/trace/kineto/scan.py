"""The compiled fast path for decoding a run of trace events, with msgspec as the rule and fallback.

``lmprof.trace.kineto._scan`` (C, built at install; see ``_scan.c``) reads a JSON list of events straight
into columns when every event in it is plain, and refuses anything else. :func:`read_chunk` uses it
when it is built and it accepts the list, else :func:`lmprof.trace.kineto.decode.decode_chunk` (msgspec);
both give the same :class:`~lmprof.trace.kineto.decode.Chunk` for every list the fast path accepts
(``tests/test_trace_scan.py`` checks it on real traces and on mutated ones). The few things the C
reader leaves to Python are decoded here with msgspec's own decoders: the distinct names, ids
written as text, the args of the events whose collective parameters are kept, and each distinct
input shape (the C reader hands over every operator's as a code into the distinct raw texts).
"""
from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType
from typing import Any

import msgspec
import numpy as np

from lmprof.trace.kineto import decode as dec
from lmprof.trace.kineto import schema

_ABI = 4  # the result shape this module reads; _scan.c's SCAN_ABI


def _load() -> ModuleType | None:
    try:  # built by `pip install` (setup.py); without a compiler lmprof still works, on msgspec alone
        module = importlib.import_module("lmprof.trace.kineto._scan")
    except ImportError:  # pragma: no cover - depends on the build
        return None
    # a stale build is never used: one with another result shape, or made from another schema
    fresh = getattr(module, "ABI", None) == _ABI and getattr(module, "SCHEMA", None) == schema.DIGEST
    return module if fresh else None


_scan = _load()

__all__ = ["NATIVE", "read_chunk", "scan_chunk"]

# LMPROF_TRACE_NATIVE=0 turns the fast path off (to compare, or to rule it out when in doubt)
NATIVE = _scan is not None and os.environ.get("LMPROF_TRACE_NATIVE", "1").strip() != "0"

_X_COLUMNS = ("name", "cat", "pid", "tid", "ts", "dur", *dec.ARG_COLUMNS)
_X_DTYPES = {"name": np.int32, "cat": np.int32, "ts": np.float64, "dur": np.float64}
_HW_AT = len(_X_COLUMNS)  # then one float64 column per HW_FIELDS name, then the args offset and length
_FL_COLUMNS = (("id", np.int64), ("ph", np.int32), ("cat", np.int32), ("pid", np.int64), ("tid", np.int64),
               ("ts", np.float64))
# odd_ids column numbers of _scan.c -> (table, column, value when absent, field named in notes, coded)
_ODD = (
    ("x", "pid", 0, "pid", True),
    ("x", "tid", 0, "tid", True),
    *(("x", k, -1, f"args.{k}", False) for k in dec.ARG_COLUMNS),
    ("fl", "id", -1, "id", True),
    ("fl", "pid", 0, "pid", True),
    ("fl", "tid", 0, "tid", True),
)
_ARGS_LIST = msgspec.json.Decoder(list[dec.Args | None])
_TEXT = msgspec.json.Decoder(str)


def read_chunk(payload: bytes | memoryview, exact: bool) -> dec.Chunk:
    """Decode one JSON list of events: the compiled fast path when it accepts the list, else msgspec."""
    ch = scan_chunk(payload) if NATIVE else None
    if ch is None:
        ch = dec.decode_chunk(payload, exact)
    ch.nbytes = len(payload)
    return ch


def scan_chunk(payload: bytes | memoryview) -> dec.Chunk | None:
    """The :class:`Chunk` of ``payload`` by the compiled reader, or None when it refuses the list."""
    if _scan is None:
        return None
    got = _scan.scan(payload)
    if got is None:
        return None
    n_raw, x_raw, fl_raw, names_raw, xcats_raw, phs_raw, flcats_raw, odd, spans, shape_raw, dims, types = got
    try:
        names, xcats, phs, flcats = (_texts(t) for t in (names_raw, xcats_raw, phs_raw, flcats_raw))
        ch = dec.Chunk(n_raw=n_raw, names=names, cats=xcats + flcats, phs=phs)
        view = memoryview(payload)
        x = {k: np.frombuffer(x_raw[i], dtype=_X_DTYPES.get(k, np.int64)) for i, k in enumerate(_X_COLUMNS)}
        if x["pid"].size:
            ch.x = x
            args_at = (np.frombuffer(x_raw[-2], dtype=np.int64), np.frombuffer(x_raw[-1], dtype=np.int64))
            hw = [np.frombuffer(x_raw[_HW_AT + i], dtype=np.float64) for i in range(len(dec.HW_FIELDS))]
            _sparse_args(ch, view, args_at, hw, names, xcats)
            _shapes(ch, shape_raw, dims, types, xcats)
        fl = {k: np.frombuffer(fl_raw[i], dtype=t) for i, (k, t) in enumerate(_FL_COLUMNS)}
        if fl["id"].size:
            fl["cat"] = fl["cat"] + np.int32(len(xcats))  # flow categories follow the X ones
            ch.fl = fl
        if odd:
            _odd_ids(ch, odd)
        if spans:
            mem = dec.EVENTS_DECODER.decode(b"[" + b",".join(view[o : o + n] for o, n in spans) + b"]")
            ch.memory = dec.memory_rows(mem)
    except dec.DECODE_ERRORS:
        return None  # the msgspec path judges it (it raises, repairs or skips exactly as before)
    return ch


def _texts(raw: list[bytes]) -> list[str]:
    # escapes are rare: the C reader has already checked the UTF-8
    return [_TEXT.decode(b'"' + r + b'"') if b"\\" in r else r.decode() for r in raw]


def _args(view: memoryview, args_at: tuple[np.ndarray, np.ndarray], rows: list[int]) -> list[Any]:
    """The args of the given X rows, decoded by msgspec (absent args read as the defaults)."""
    off, n = args_at
    parts = [view[o : o + k] if o >= 0 else b"null" for o, k in zip(off[rows].tolist(), n[rows].tolist())]
    got = _ARGS_LIST.decode(b"[" + b",".join(parts) + b"]")
    return [a if a is not None else dec.NO_ARGS for a in got]


def _sparse_args(
    ch: dec.Chunk,
    view: memoryview,
    args_at: tuple[np.ndarray, np.ndarray],
    hw: list[np.ndarray],
    names: list[str],
    cats: list[str],
) -> None:
    """Collective parameters (decoded from the events that can carry them) and kernel resources
    (read by the C reader as numbers, NaN for absent or null, then the rule of decode.hw_values)."""
    name_codes, cat_codes = ch.x["name"], ch.x["cat"]
    rows = _rows_coded(name_codes, [_may_carry_comms(n) for n in names]).tolist()
    for i, a in zip(rows, _args(view, args_at, rows)):
        if dec.carries_comms(a):
            ch.comm_rows.append(i)
            ch.comm_values.append(dec.comm_fields(a))
    dev_idx = _rows_coded(cat_codes, [k.lower() in dec.HW_CATS for k in cats])
    ch.hw_rows = dev_idx.astype(np.int64)
    ch.hw_cols = {f: dec.hw_values(col[dev_idx]) for f, col in zip(dec.HW_FIELDS, hw)}


def _shapes(ch: dec.Chunk, shape_raw: tuple[Any, ...], dims: list[bytes], types: list[bytes], cats: list[str]) -> None:
    """The input shapes of the operators (record_shapes): the C reader gives each X row with an
    "Input Dims" and the codes of its raw dims and types text; only operator rows keep them."""
    rows = np.frombuffer(shape_raw[0], dtype=np.int64)
    if not rows.size:
        return
    is_op = np.zeros(len(cats), dtype=bool)
    is_op[dec.shape_cat_codes(cats)] = True
    keep = is_op[ch.x["cat"][rows]]
    n_types = len(types) + 1  # a pair is dims code * n_types + types code + 1 (0: no types)
    pairs = np.frombuffer(shape_raw[1], dtype=np.int32)[keep].astype(np.int64) * n_types
    pairs += np.frombuffer(shape_raw[2], dtype=np.int32)[keep] + 1

    def raw(pair: int) -> tuple[bytes, bytes | None]:
        d, t = divmod(pair, n_types)
        return dims[d], types[t - 1] if t else None

    dec.add_shapes(ch, rows[keep], pairs, raw)


def _rows_coded(codes: np.ndarray, wanted: list[bool]) -> np.ndarray:
    """Rows whose code (an index into the chunk's own list of texts) is wanted: a table lookup,
    a fraction of ``np.isin``'s cost on the few hundred codes of a chunk."""
    if not any(wanted):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.array(wanted, dtype=bool)[codes])


# Each chunk names its events anew (a few hundred distinct names, the same from chunk to chunk):
# the answer for a name is kept, for as many names as a large trace has, not for a hostile file's.
_may_carry_comms = functools.lru_cache(maxsize=1 << 14)(dec.may_carry_comms)


def _odd_ids(ch: dec.Chunk, odd: list[tuple[int, int, bytes]]) -> None:
    """Ids written as text, by decode.odd_id's rule (the C reader left their cells 0)."""
    # by column, then row: the order decode.py codes text ids in, so both give the same codes
    for col, row, raw in sorted(odd, key=lambda o: (o[0], o[1])):
        table, name, none, fld, coded = _ODD[col]
        columns, codes = (ch.x, ch.x_coded) if table == "x" else (ch.fl, ch.fl_coded)
        # the columns are numpy views of the C reader's bytearrays: writable in place
        columns[name][row] = dec.odd_id(ch, _texts([raw])[0], row, none, fld, codes if coded else None)
