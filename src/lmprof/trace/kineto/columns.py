"""The trace's columns, built from decoded chunks: growing blocks, trace-wide codes, typed frames.

:class:`Merger` appends :class:`~lmprof.trace.kineto.decode.Chunk` s in file order, mapping their local
codes (names, categories, phases, text ids) to trace-wide ones; :func:`frames` then sorts the events
by time and returns the :class:`~lmprof.trace.frame.Frame` s of :class:`~lmprof.trace.load.TraceTable` (events, flows, and the
sparse tables of collective parameters, kernel resources and allocator events).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lmprof.trace.kineto.decode import ARG_COLUMNS, COMM_FIELDS, HW_FIELDS, MAX_INT, Chunk, Coded, parse_int, to_float
from lmprof.trace.fields import COMM_TEXT, MEMORY_COLUMNS
from lmprof.trace.frame import Frame, str_labels
from lmprof.trace.table import empty_comms, empty_hw, empty_shapes

# Distinct operator shapes kept: a real trace has a few thousand (one per layer and shape); beyond
# this a (hostile) trace of all-different shapes would grow the table with its size, so new ones are
# left out and counted (the operators stay; only their shapes are dropped).
MAX_DISTINCT_SHAPES = 100_000
_FIRST_BLOCK = 1 << 16  # rows in a column's first block: small traces stay small
_BLOCK = 1 << 20  # at most this many rows per block (8 MiB for int64); blocks double up to it


class _Column:
    """One growing column kept in a few large blocks.

    Why blocks rather than a list of per-chunk arrays: many small long-lived arrays interleave with
    each chunk's short-lived Python objects on the malloc heap, and that fragmentation roughly
    doubled the peak resident memory. Large blocks are mapped on their own and given back on free.
    """

    __slots__ = ("dtype", "blocks", "fill", "rows", "expect")

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype
        self.blocks: list[np.ndarray] = []
        self.fill = 0  # rows used in the last block
        self.rows = 0
        self.expect = 0  # rows the whole column is expected to reach (0: unknown)

    def add(self, arr: np.ndarray) -> None:
        i, n = 0, len(arr)
        while i < n:
            if not self.blocks or self.fill == len(self.blocks[-1]):
                # doubling: a column never holds more than about a third of its size unused (a fixed
                # 1 M-row second block left a 440 k-row flow table 60% empty)
                size = min(max(_FIRST_BLOCK, self.rows), _BLOCK)
                if self.expect > self.rows + size:
                    # the rest of the expected rows in one block (usually the whole column in its
                    # first): once sorted into place and freed, it is one hole the next column's
                    # sorted copy fits in, where doubling blocks left holes too small for it and
                    # every copy took fresh pages; a column needing no sort is the block itself.
                    # Rows never written cost no memory (pages are only faulted in when touched).
                    try:
                        self.blocks.append(np.empty(self.expect - self.rows, dtype=self.dtype))
                    except MemoryError:  # address space refused (ulimit -v): grow as without the plan
                        self.expect = 0
                        self.blocks.append(np.empty(size, dtype=self.dtype))
                else:
                    self.blocks.append(np.empty(size, dtype=self.dtype))
                self.fill = 0
            block = self.blocks[-1]
            k = min(n - i, len(block) - self.fill)
            block[self.fill : self.fill + k] = arr[i : i + k]
            self.fill += k
            i += k
        self.rows += n

    def take(self, inverse: np.ndarray | None = None) -> np.ndarray:
        """The whole column (rows moved to ``inverse[i]`` when given); frees the blocks as it goes."""
        if inverse is None and len(self.blocks) == 1:  # in one block already: no copy
            out = self.blocks.pop()[: self.fill]
            self.rows = self.fill = 0
            return out
        out = np.empty(self.rows, dtype=self.dtype)
        start = 0
        while self.blocks:
            block = self.blocks.pop(0)
            piece = block if self.blocks else block[: self.fill]
            stop = start + len(piece)
            if inverse is None:
                out[start:stop] = piece
            else:
                out[inverse[start:stop]] = piece
            start = stop
            del block, piece
        self.rows = self.fill = 0
        return out


class _Columns:
    """Named :class:`_Column` s filled chunk by chunk."""

    def __init__(self, dtypes: dict[str, Any]) -> None:
        self.cols = {name: _Column(dtype) for name, dtype in dtypes.items()}

    @property
    def rows(self) -> int:
        """Rows added so far (every column has as many)."""
        return next(iter(self.cols.values())).rows

    def expect(self, rows: int) -> None:
        for c in self.cols.values():
            c.expect = rows

    def add(self, name: str, arr: np.ndarray) -> None:
        self.cols[name].add(arr)

    def take(self, name: str, inverse: np.ndarray | None = None) -> np.ndarray:
        return self.cols[name].take(inverse)


# Bytes per event below which no trace goes on average (Kineto writes 150-300): the most rows the
# expectation below will ever plan for, so a small first chunk of tiny events cannot make it huge.
_MIN_EVENT_BYTES = 100


class Merger:
    """Appends chunks in file order, mapping their local codes to trace-wide ones.

    ``expect_bytes``: the size of the JSON being read (0: unknown). With it, the columns expect as
    many rows as the chunks so far have per byte (with a tenth more), which lets each column grow in
    one large block (see :meth:`_Column.add`). ``flows``: keep the flow events (else they are read,
    counted in ``n_raw`` and dropped).
    """

    def __init__(self, expect_bytes: int = 0, flows: bool = True) -> None:
        self.expect_bytes = expect_bytes
        self.keep_flows = flows
        self.seen_bytes = 0
        i64, f64, i32 = np.int64, np.float64, np.int32
        self.x = _Columns(
            {"name": i32, "cat": i32, "pid": i64, "tid": i64, "ts": f64, "dur": f64, **{k: i64 for k in ARG_COLUMNS}}
        )
        self.fl = _Columns({"id": i64, "ph": i32, "cat": i32, "pid": i64, "tid": i64, "ts": f64})
        self.names: dict[Any, int] = {}
        self.cats: dict[Any, int] = {}
        self.phs: dict[Any, int] = {}
        self.id_codes: dict[str, int] = {}
        self.n_raw = 0
        self.skipped = 0
        self.repaired_utf8 = 0
        self.out_of_range: dict[str, int] = {}
        self.first_problem: str | None = None
        self.comm_raw: list[int] = []  # raw (pre-sort) index of events with collective parameters
        self.comm_values: list[tuple[Any, ...]] = []
        self.hw_raw: list[np.ndarray] = []  # raw indices of device events, per chunk
        self.hw_cols: dict[str, list[np.ndarray]] = {f: [] for f in HW_FIELDS}  # per chunk
        self.memory: list[tuple[Any, ...]] = []
        self.shape_raw: list[np.ndarray] = []  # raw indices of operator events with input shapes, per chunk
        self.shape_codes: list[np.ndarray] = []  # their (dims, types) as a code into self.shape_table
        self.shape_table: dict[tuple[Any, Any], int] = {}
        self.shapes_dropped = 0
        self.comms: Frame = empty_comms()  # replaced when the columns are finished
        self.hw: Frame = empty_hw()
        self.shapes: Frame = empty_shapes()

    def add(self, ch: Chunk) -> None:
        self.n_raw += ch.n_raw
        self.seen_bytes += ch.nbytes
        if self.expect_bytes and self.seen_bytes:
            scale = self.expect_bytes / self.seen_bytes
            for cols, added in ((self.x, len(ch.x.get("ts", ()))), (self.fl, len(ch.fl.get("ts", ())))):
                cols.expect(min(int((cols.rows + added) * scale * 1.1), self.expect_bytes // _MIN_EVENT_BYTES))
        self.skipped += ch.skipped
        self.repaired_utf8 += ch.repaired_utf8
        if self.first_problem is None:
            self.first_problem = ch.first_problem
        for k, n in ch.out_of_range.items():
            self.out_of_range[k] = self.out_of_range.get(k, 0) + n
        cats = self._remap(self.cats, ch.cats)
        if ch.x:
            base = self.x.rows
            self._append(self.x, ch.x, {"name": self._remap(self.names, ch.names), "cat": cats}, ch.x_coded)
            self.comm_raw += [base + r for r in ch.comm_rows]
            self.comm_values += ch.comm_values
            if ch.shape_values:
                self._add_shapes(base, ch)
            if ch.hw_rows.size:
                self.hw_raw.append(base + ch.hw_rows)
                for f in HW_FIELDS:
                    self.hw_cols[f].append(ch.hw_cols[f])
        if ch.fl and self.keep_flows:
            self._append(self.fl, ch.fl, {"ph": self._remap(self.phs, ch.phs), "cat": cats}, ch.fl_coded)
        self.memory += ch.memory

    def _add_shapes(self, base: int, ch: Chunk) -> None:
        """A chunk's input shapes: its distinct ones get trace-wide codes (distinct shapes are few, one
        per layer and shape: each is stored once, rows hold codes), new ones in order of first
        appearance until MAX_DISTINCT_SHAPES, after which the rows of new ones are counted and left out."""
        remap = np.empty(len(ch.shape_values), dtype=np.int64)
        for j, v in enumerate(ch.shape_values):
            code = self.shape_table.get(v)
            if code is None:
                code = -1 if len(self.shape_table) >= MAX_DISTINCT_SHAPES else len(self.shape_table)
                if code >= 0:
                    self.shape_table[v] = code
            remap[j] = code
        codes = remap[ch.shape_codes]
        keep = codes >= 0
        rows = ch.shape_rows
        if not keep.all():
            self.shapes_dropped += int(keep.size - keep.sum())
            rows, codes = rows[keep], codes[keep]
        self.shape_raw.append(base + rows)
        self.shape_codes.append(codes)

    def _append(
        self, into: _Columns, cols: dict[str, np.ndarray], recode: dict[str, np.ndarray], coded: dict[str, Coded]
    ) -> None:
        """Append a chunk's columns, its local codes replaced through ``recode`` (column -> map)."""
        cols = {k: recode[k][v] if k in recode else v for k, v in cols.items()}
        self._code_ids(cols, coded)
        for k, v in cols.items():
            into.add(k, v)

    @staticmethod
    def _remap(table: dict[Any, int], local: list[Any]) -> np.ndarray:
        return np.array([table.setdefault(v, len(table)) for v in local], dtype=np.int32)

    def _code_ids(self, cols: dict[str, np.ndarray], coded: dict[str, Coded]) -> None:
        # Non-numeric or out-of-range ids ("Spans", "stream 7 ...", 2**64): stable negative codes,
        # names kept in meta, so distinct threads stay distinct.
        for fld, c in coded.items():
            col = cols[fld] = cols[fld].copy()
            col[c.rows] = [self.id_codes.setdefault(s, -1000 - len(self.id_codes)) for s in c.text]


def _categorical(codes: np.ndarray, table: dict[Any, int], lower: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Codes (int32) and their labels (object array of str) of a category column."""
    labels = []
    for k in table:  # insertion order == code order
        s = "" if k is None else (k if isinstance(k, str) else str(k))
        labels.append(s.lower() if lower else s)
    if len(set(labels)) != len(labels):  # e.g. "Kernel" and "kernel": merge their codes
        uniq, remap = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
        codes = remap.astype(np.int32)[codes] if codes.size else codes
        labels = list(uniq)
    return codes.astype(np.int32, copy=False), str_labels(labels)


_MAX_TIME_US = 1e18  # 31,000 years: beyond this a timestamp or duration is junk


def shapes_frame(rows: np.ndarray, codes: np.ndarray, table: list[tuple[Any, Any]], keep: np.ndarray) -> Frame:
    """Operators' input shapes: ``row`` into events, ``dims`` and ``types`` (see decode.shape_fields),
    and ``shape``, the code of the pair (equal shapes, equal codes: grouping needs no tuple hashing).

    Equal shapes share one tuple object, so the frame costs a few pointers per row."""
    rows, codes = rows[keep], codes[keep]
    order = np.argsort(rows, kind="stable")
    rows, codes = rows[order], codes[order]
    dims_of = np.empty(len(table), dtype=object)
    types_of = np.empty(len(table), dtype=object)
    for j, (d, t) in enumerate(table):  # (one by one: numpy would read the tuples as arrays)
        dims_of[j], types_of[j] = d, t
    return Frame({"row": rows.astype(np.int64), "dims": dims_of[codes], "types": types_of[codes],
                  "shape": codes.astype(np.int64)})


def _comms_frame(rows: np.ndarray, values: list[tuple[Any, ...]], keep: np.ndarray) -> Frame:
    """Collective parameters as typed columns: ints (-1 when absent or odd), names as str ("" absent)."""
    values = [v for v, k in zip(values, keep.tolist()) if k]
    rows = rows[keep]
    order = np.argsort(rows, kind="stable")
    values = [values[i] for i in order.tolist()]
    cols: dict[str, np.ndarray] = {"row": rows[order]}
    for j, f in enumerate(COMM_FIELDS):
        column = [v[j] for v in values]
        if f in COMM_TEXT:
            cols[f] = str_labels([_short_str(x) for x in column])
        else:
            cols[f] = np.array([_small_int(x) for x in column], dtype=np.int64)
    return Frame(cols)


def hw_frame(rows: np.ndarray, values: dict[str, list[np.ndarray]], keep: np.ndarray) -> Frame:
    """Kernel resources and copy sizes as float columns (NaN when absent or not a number in
    [0, 1e30): see decode.hw_values), from each chunk's columns.

    Rows of device events without any of them (no registers and no bytes) are dropped.
    """
    full: dict[str, np.ndarray] = {}
    for f in HW_FIELDS:
        parts = values.get(f, [])
        col = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
        if col.size != rows.size:  # a chunk lost its values: keep the frame consistent
            col = np.full(rows.size, np.nan)
        full[f] = col
    # the rows kept, in table order: one gather per column
    kept = np.flatnonzero(keep & (~np.isnan(full["registers"]) | ~np.isnan(full["nbytes"])))
    kept = kept[np.argsort(rows[kept], kind="stable")]
    return Frame({"row": rows[kept], **{f: full[f][kept] for f in HW_FIELDS}})


def memory_frame(rows: list[tuple[Any, ...]]) -> Frame:
    """The allocator events as typed columns (see the module docstring)."""
    cols: dict[str, np.ndarray] = {
        "ts": np.array([to_float(r[0]) for r in rows], dtype=np.float64),
        "pid": np.array([_any_int(r[1], 0) for r in rows], dtype=np.int64),
        "tid": np.array([_any_int(r[2], 0) for r in rows], dtype=np.int64),
    }
    for j, name in enumerate(MEMORY_COLUMNS):
        absent = 0 if name == "bytes" else -1
        cols[name] = np.array([_any_int(r[3 + j], absent) for r in rows], dtype=np.int64)
    return Frame(cols)


def _any_int(x: Any, absent: int) -> int:
    """An int64 from a JSON value (int, integral float, decimal or hex text), else ``absent``."""
    if isinstance(x, bool) or x is None:
        return absent
    if isinstance(x, float):
        return int(x) if x.is_integer() and abs(x) < MAX_INT else absent
    if isinstance(x, str):
        v = parse_int(x.strip())
        return absent if v is None else v
    return x if isinstance(x, int) and -MAX_INT <= x < MAX_INT else absent


def _short_str(x: Any) -> str:
    return "" if x is None or isinstance(x, (list, dict)) else str(x)[:200]


def _small_int(x: Any) -> int:
    if isinstance(x, bool) or x is None:
        return -1
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, str) and x.strip().isdigit() and len(x.strip()) < 19:
        x = int(x.strip())
    return x if isinstance(x, int) and 0 <= x < MAX_INT else -1


def frames(b: Merger) -> tuple[Frame, Frame, int]:
    """Events and flows as frames, events sorted by ts; also how many events had junk times."""
    x = b.x
    ts = x.take("ts")
    inverse = None
    bad = ~(np.abs(ts) <= _MAX_TIME_US)  # NaN-safe: catches inf too
    if bad.any():  # junk times would stretch every window: such events are left out
        ts = ts.copy()
        ts[bad] = np.inf  # sorts last; cut off below
    if ts.size > 1 and not bool((ts[1:] >= ts[:-1]).all()):
        order = np.argsort(ts, kind="stable")
        ts = ts[order]
        # scatter every other column straight into sorted position: no unsorted full-size copy
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size, dtype=order.dtype)
        del order
    name_codes, name_labels = _categorical(x.take("name", inverse), b.names)
    cat_codes, cat_labels = _categorical(x.take("cat", inverse), b.cats, lower=True)
    cols: dict[str, np.ndarray] = {
        "name": name_codes,
        "cat": cat_codes,
        "pid": x.take("pid", inverse),
        "tid": x.take("tid", inverse),
        "ts": ts,
        "dur": x.take("dur", inverse),
    }
    for name in ARG_COLUMNS:
        cols[name] = x.take(name, inverse)
    comm_rows = np.asarray(b.comm_raw, dtype=np.int64)
    shape_rows = np.concatenate(b.shape_raw) if b.shape_raw else np.empty(0, dtype=np.int64)
    shape_codes = np.concatenate(b.shape_codes) if b.shape_codes else np.empty(0, dtype=np.int64)
    hw_rows = np.concatenate(b.hw_raw) if b.hw_raw else np.empty(0, dtype=np.int64)
    if inverse is not None:
        comm_rows, hw_rows, shape_rows = inverse[comm_rows], inverse[hw_rows], inverse[shape_rows]
    del inverse
    bad_dur = ~(np.abs(cols["dur"]) <= _MAX_TIME_US)
    keep = np.isfinite(cols["ts"]) & ~bad_dur
    dropped = int(len(keep) - keep.sum())
    comm_keep = np.ones(comm_rows.size, dtype=bool)
    hw_keep = np.ones(hw_rows.size, dtype=bool)
    shape_keep = np.ones(shape_rows.size, dtype=bool)
    if dropped:
        cols = {k: v[keep] for k, v in cols.items()}
        new_row = np.cumsum(keep) - 1
        comm_keep, hw_keep = keep[comm_rows], keep[hw_rows]
        comm_rows, hw_rows = new_row[comm_rows], new_row[hw_rows]
        shape_keep, shape_rows = keep[shape_rows], new_row[shape_rows]
    b.comms = _comms_frame(comm_rows, b.comm_values, comm_keep)
    b.hw = hw_frame(hw_rows, b.hw_cols, hw_keep)
    b.shapes = shapes_frame(shape_rows, shape_codes, list(b.shape_table), shape_keep)
    events = Frame(cols, {"name": name_labels, "cat": cat_labels})
    f = b.fl
    ph_codes, ph_labels = _categorical(f.take("ph"), b.phs)
    flow_cat_codes, flow_cat_labels = _categorical(f.take("cat"), b.cats, lower=True)
    flows = Frame(
        {
            "id": f.take("id"),
            "ph": ph_codes,
            "cat": flow_cat_codes,
            "pid": f.take("pid"),
            "tid": f.take("tid"),
            "ts": f.take("ts"),
        },
        {"ph": ph_labels, "cat": flow_cat_labels},
    )
    return events, flows, dropped
