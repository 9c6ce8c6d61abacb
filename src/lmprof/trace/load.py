"""Load a Kineto / Chrome trace (JSON, plain or gzipped) into one columnar table.

Every analysis is a function of the :class:`TraceTable` this returns; nothing re-reads the file.

Columns of ``TraceTable.events`` (one row per complete ``"ph": "X"`` event, sorted by ``ts``):

============  =========  ========================================================================
column        dtype      meaning
============  =========  ========================================================================
name          category   event name (operator, kernel, annotation, runtime call)
cat           category   Kineto category, lower-cased: cpu_op, user_annotation, kernel,
                         gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver, gpu_user_annotation,
                         python_function, ... ("" when absent)
pid, tid      int64      process / thread (GPU: device / stream); non-integer ids get stable codes
ts, dur       float64    start and duration, microseconds
correlation   int64      args.correlation (runtime call <-> kernel), -1 when absent
external_id   int64      args["External id"] (cpu op <-> runtime call), -1 when absent
seq           int64      args["Sequence number"] (forward op <-> backward node), -1 when absent
stream        int64      args.stream for device events, -1 when absent
device        int64      args.device for device events, -1 when absent
============  =========  ========================================================================

``TraceTable.comms`` holds the collective parameters of the few events that carry them (column
``row`` into ``events``; collective, in_nelems, out_nelems, dtype, group_size, pg_name, coll_seq).
``TraceTable.hw`` holds what CUPTI reports per kernel and copy, for the events that have it (column
``row``; registers, shared_memory (bytes per block), blocks_per_sm, warps_per_sm, occupancy (est.
achieved occupancy %), nbytes (a copy's or set's size); NaN when absent).
``TraceTable.memory`` holds the allocator's ``[memory]`` instant events (``profile_memory=True``) in
file order: ts (float64 us), pid, tid, device_type (0 CPU, 1 CUDA, ...), device_id, bytes (negative
for a free), addr, ev_idx, total_allocated, total_reserved (int64, -1 when absent or odd; bytes 0).
``TraceTable.flows`` holds flow events (``ph`` s/t/f) with columns id, ph, cat, pid, tid, ts.
``TraceTable.meta`` keeps the top-level fields (distributedInfo, deviceProperties, ...).

How it stays fast and lean: the file is read (and gunzipped) in bounded chunks and never held whole.
Each chunk is cut after its last complete event (see :class:`_Splitter`), that run of events is
decoded by msgspec into small typed structs in place, and the structs become numpy columns before
the next chunk is read. So the peak extra memory is about the final columns plus one chunk's worth
of Python objects, and no step walks the events one by one in Python except attribute reads.

Timestamps are float64 microseconds: traces stamped in Unix-epoch microseconds (~1.7e15, older
Kineto) resolve 0.25 us in float64; newer ones (relative to baseTimeNanoseconds) resolve ~1 ns.
"""
from __future__ import annotations

import os
import stat
import sys
import zlib
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import msgspec
import numpy as np
import pandas as pd

from lmprof.errors import DataError

_READ_BYTES = 2 << 20  # decoded bytes handled per step: bounds the transient Python objects
_GZIP_IN = 1 << 20  # compressed bytes read per gunzip step


class _Args(msgspec.Struct, gc=False):
    correlation: int | str | None = -1
    external_id: int | str | None = msgspec.field(default=-1, name="External id")
    seq: int | str | None = msgspec.field(default=-1, name="Sequence number")
    stream: int | str | None = -1
    device: int | str | None = -1
    # collective parameters (record_param_comms, and NCCL kernels in newer traces); Any: an odd
    # value here must never cost the event
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    coll_seq: Any = msgspec.field(default=None, name="Seq")
    # what CUPTI reports per kernel / memcpy (kernel resources and the copy's size)
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    nbytes: Any = msgspec.field(default=None, name="bytes")
    # allocator events ("[memory]" instants of profile_memory=True)
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    addr: Any = msgspec.field(default=None, name="Addr")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    ev_idx: Any = msgspec.field(default=None, name="Ev Idx")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")


_NO_ARGS = _Args()
_COMM_FIELDS = ("collective", "in_nelems", "out_nelems", "dtype", "group_size", "pg_name", "coll_seq")
_HW_FIELDS = ("registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy", "nbytes")
_MEM_FIELDS = ("device_type", "device_id", "mem_bytes", "addr", "ev_idx", "total_allocated", "total_reserved")
_MEMORY_EVENT = "[memory]"
_INSTANT_PHASES = ("i", "I")
_FLOW_PHASES = ("s", "t", "f")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str | int | float | None = ""
    cat: str | None = ""
    pid: int | str | None = 0
    tid: int | str | None = 0
    ts: float | str | None = 0.0
    dur: float | str | None = 0.0
    id: int | str | None = -1
    args: _Args | None = None


class _Meta(msgspec.Struct):
    # Any: odd metadata must never make a trace unreadable
    traceEvents: list[Any] = []
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    traceName: Any = None


_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_EVENT_DECODER = msgspec.json.Decoder(_Event)
# What a decoder raises on input it cannot read: bad JSON or types, invalid UTF-8 in a string, and
# nesting deeper than the decoder's recursion limit (e.g. 100,000 nested arrays in args).
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
_MAX_INT = 2**63
_META_DECODER = msgspec.json.Decoder(_Meta)
_LIST_META_DECODER = msgspec.json.Decoder(list[Any])


@dataclass
class TraceTable:
    """A trace as columns. ``rank`` comes from distributedInfo when the trace has it.

    Treat the frames as read-only: analyses cache arrays derived from them in ``cache``.
    """

    events: pd.DataFrame
    flows: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # what the loader skipped or repaired, one sentence each (empty for a clean trace)
    notes: list[str] = field(default_factory=list)
    # collective parameters of the events that carry them (see the module docstring)
    comms: pd.DataFrame = field(default_factory=lambda: _empty_comms())
    # kernel resources and copy sizes of the device events that carry them (see the module docstring)
    hw: pd.DataFrame = field(default_factory=lambda: _hw_frame(np.empty(0, dtype=np.int64), {}, np.empty(0, dtype=bool)))
    # the allocator's "[memory]" instant events, in file order (see the module docstring)
    memory: pd.DataFrame = field(default_factory=lambda: _memory_frame([]))

    @property
    def rank(self) -> int | None:
        """distributedInfo.rank when it is a plausible rank (0 <= rank < MAX_RANK), else None."""
        return parse_rank(self.meta.get("distributedInfo"))

    @property
    def has_gpu(self) -> bool:
        return bool(self.events["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).any())


MAX_RANK = 1 << 24  # no job has more ranks; anything larger is junk, not a rank


def parse_rank(info: Any) -> int | None:
    """The rank in a distributedInfo dict, or None when absent or not a plausible rank number."""
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, bool):
        return None
    if isinstance(rank, str) and rank.strip().isdigit() and len(rank.strip()) < 10:
        rank = int(rank.strip())
    if isinstance(rank, float) and rank.is_integer():
        rank = int(rank)
    return rank if isinstance(rank, int) and 0 <= rank < MAX_RANK else None


# --------------------------------------------------------------------------------------------- bytes


def _chunks(path: Path) -> Iterator[bytes]:
    """Yield the decoded bytes of ``path`` in pieces of at most ~_READ_BYTES; gunzips transparently."""
    f = open_regular(path)
    with f:
        head = f.read(2)
        if head != b"\x1f\x8b":
            yield head + f.read(max(_READ_BYTES - 2, 0))
            while block := f.read(_READ_BYTES):
                yield block
            return
        f.seek(0)
        yield from _gunzip(f, path)


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; else DataError naming what it is.

    The type is checked on the open descriptor (opened non-blocking), so a FIFO, a device such as
    /dev/null or /dev/zero, or a socket can never make the loader wait or read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise DataError(f"trace not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, not a trace file") from None
    except OSError as exc:
        raise DataError(f"cannot read trace {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise DataError(f"{path} is a folder, not a trace file")
        if not stat.S_ISREG(mode):
            raise DataError(f"{path} is {_file_kind(mode)}, not a trace file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _gunzip(f: Any, path: Path) -> Iterator[bytes]:
    d = zlib.decompressobj(wbits=31)
    data = b""
    try:
        while True:
            if not data:
                data = f.read(_GZIP_IN)
                if not data:
                    break
            if d.eof:
                if data[:2] != b"\x1f\x8b":
                    break  # padding or junk after the last gzip member: ignored, as gzip(1) does
                d = zlib.decompressobj(wbits=31)  # concatenated gzip members
            # max_length bounds each piece, so a highly compressed trace never inflates at once
            out = d.decompress(data, _READ_BYTES)
            if out:
                yield out
            data = d.unused_data if d.eof else d.unconsumed_tail
    except zlib.error as exc:
        raise DataError(f"{path}: gzip data is corrupt ({exc})") from None
    if not d.eof:
        raise DataError(f"{path}: gzip data is truncated (the file ends before the compressed stream does)")


# ---------------------------------------------------------------------------------------- splitting

_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[list(b'{}[]"')] = True
_OPEN_BRACE, _CLOSE_BRACE, _OPEN_BRACKET, _CLOSE_BRACKET, _QUOTE, _BACKSLASH, _COMMA = b"{}[]\"\\,"
_WS = b" \t\r\n"


def _brackets(buf: bytes | bytearray | memoryview, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions, characters and depth-after of every bracket of ``buf`` that is outside a string.

    ``buf`` must start outside any string at nesting depth ``depth0``. Vectorised: only the bytes
    { } [ ] and unescaped quotes are looked at, and string state is the parity of quotes seen.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    idx = np.flatnonzero(_STRUCTURAL[a])
    ch = a[idx]
    is_quote = ch == _QUOTE
    q = idx[is_quote]
    maybe_escaped = q[(q > 0) & (a[np.maximum(q - 1, 0)] == _BACKSLASH)]
    if maybe_escaped.size:  # rare: count the backslash run before each such quote
        escaped = [p for p in maybe_escaped.tolist() if _odd_backslashes(a, p)]
        if escaped:
            is_quote &= ~np.isin(idx, escaped)
    # uint8 cumsum wraps at 256, which keeps the parity we need
    outside = (np.cumsum(is_quote, dtype=np.uint8) & 1) == 0
    keep = outside & (ch != _QUOTE)
    pos, ch = idx[keep], ch[keep]
    delta = np.where((ch == _OPEN_BRACE) | (ch == _OPEN_BRACKET), 1, -1).astype(np.int32)
    depth = depth0 + np.cumsum(delta, dtype=np.int32)
    return pos, ch, depth


def _list_items(payload: bytes | memoryview) -> list[memoryview]:
    """The items of the JSON list ``payload`` (``[a, b, ...]``) as slices, found without decoding.

    Items are split at the commas at depth 1 outside strings; what an item holds is not checked
    (that is the decoder's job), so a malformed item is one slice the caller can skip.
    """
    view = memoryview(payload)
    a = np.frombuffer(view, dtype=np.uint8)
    if a.size < 2:
        return []
    idx = np.flatnonzero(_STRUCTURAL[a] | (a == _COMMA))
    ch = a[idx]
    is_quote = ch == _QUOTE
    q = idx[is_quote]
    maybe_escaped = q[(q > 0) & (a[np.maximum(q - 1, 0)] == _BACKSLASH)]
    if maybe_escaped.size:
        escaped = [p for p in maybe_escaped.tolist() if _odd_backslashes(a, p)]
        if escaped:
            is_quote &= ~np.isin(idx, escaped)
    outside = (np.cumsum(is_quote, dtype=np.uint8) & 1) == 0
    keep = outside & (ch != _QUOTE)
    pos, ch = idx[keep], ch[keep]
    delta = np.where((ch == _OPEN_BRACE) | (ch == _OPEN_BRACKET), 1, np.where(ch == _COMMA, 0, -1))
    depth_after = np.cumsum(delta, dtype=np.int64)
    # commas at depth 1 separate items; the list's own brackets are the first and last byte
    cuts = pos[(ch == _COMMA) & (depth_after == 1)]
    bounds = [0, *cuts.tolist(), a.size - 1]
    items = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        item = view[lo + 1 : hi]
        if bytes(item).strip(_WS):
            items.append(item)
    return items


def _describe(exc: BaseException) -> str:
    """A one-line reason for an unreadable event."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "invalid UTF-8"
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _odd_backslashes(a: np.ndarray, p: int) -> bool:
    n = 0
    while p - 1 - n >= 0 and a[p - 1 - n] == _BACKSLASH:
        n += 1
    return n % 2 == 1


class _Splitter:
    """Feeds decoded bytes; hands out JSON lists of complete events and keeps the rest as metadata.

    States: ``start``, ``prefix`` until the traceEvents list opens, ``events`` inside it, ``suffix``
    after it. In ``events`` the buffer always begins with the list's ``[`` or the comma before the
    next event, so a run of complete events becomes a JSON list in place: that first byte is set to
    ``[`` and the comma after the run to ``]``, and msgspec decodes the slice without a copy.

    Cuts are first guessed cheaply (the last ``}`` followed by a comma); a wrong guess always makes
    invalid JSON (an open string or unbalanced brackets), and then the exact vectorised bracket scan
    decides. Only the prefix, a failed guess and the final piece are ever scanned.
    """

    def __init__(self, path: Path, on_events: Callable[[memoryview, bool], None]) -> None:
        self.path = path
        self.on_events = on_events
        self.state = "start"
        self.buf = bytearray()
        self.prefix = b""
        self.suffix: list[bytes] = []
        self.array_depth = 0
        self.seen_bytes = 0
        self.exact_at = 0  # buffer length from which the next exact scan runs
        self.prefix_at = 0  # same for the prefix scan

    def feed(self, chunk: bytes) -> None:
        self.seen_bytes += len(chunk)
        if self.state == "suffix":
            self.suffix.append(chunk)
            return
        self.buf += chunk
        if self.state == "start":
            self._start()
        if self.state == "prefix" and len(self.buf) >= self.prefix_at:
            self._prefix()
            self.prefix_at = 2 * len(self.buf)
        if self.state == "events":
            self._events_guess()

    def _start(self) -> None:
        i, n = 0, len(self.buf)
        if self.buf[:3] == b"\xef\xbb\xbf":  # UTF-8 byte order mark
            i = 3
        while i < n and self.buf[i] in _WS:
            i += 1
        if i == n:
            self.buf = bytearray()
            return
        del self.buf[:i]
        first = self.buf[:1]
        if first == b"[":  # Chrome "JSON Array Format": the root is the event list itself
            self.prefix, self.array_depth, self.state = b"[", 1, "events"
        elif first == b"{":
            self.state = "prefix"
        else:
            raise DataError(
                f"{self.path}: not a JSON trace (it starts with {bytes(first)!r}, expected '{{' or '[')"
            )

    def _prefix(self) -> None:
        pos, ch, depth = _brackets(self.buf, 0)
        for p in pos[(ch == _OPEN_BRACKET) & (depth == 2)].tolist():
            before = bytes(self.buf[max(0, p - 64) : p]).rstrip(_WS)
            if before.endswith(b":") and before[:-1].rstrip(_WS).endswith(b'"traceEvents"'):
                self.prefix = bytes(self.buf[: p + 1])
                del self.buf[:p]  # keep the "[" as the buffer's first byte
                self.array_depth, self.state = 2, "events"
                return
        if (depth <= 0).any():
            raise DataError(f"{self.path}: JSON has no traceEvents list (not a Kineto / Chrome trace)")

    def _guess_cut(self) -> int | None:
        """Index of the comma after the last event that looks complete, or None.

        An event looks complete at a ``}`` followed by a comma and the next event's ``{`` (spaces
        allowed between). Requiring the ``{`` keeps C++ names such as ``{lambda(float)#1}, at::...``
        in kernel names from being taken for cuts: a wrong guess costs a retry in-process and a
        whole second pass when chunks are decoded in parallel.
        """
        buf, end, n = self.buf, len(self.buf), len(self.buf)
        for _ in range(64):  # bounded: a giant event or junk must not make this quadratic
            e = buf.rfind(b"}", 1, end)
            if e < 0:
                return None
            j = e + 1
            while j < n and buf[j] in _WS:
                j += 1
            if j < n and buf[j] == _COMMA:
                k = j + 1
                while k < n and buf[k] in _WS:
                    k += 1
                if k < n and buf[k] == _OPEN_BRACE:
                    return j
            end = e
        return None

    def _events_guess(self) -> None:
        cut = self._guess_cut()
        if cut is not None:
            try:
                self._emit(cut, exact=False)
                return
            except _DECODE_ERRORS:
                pass  # a wrong guess (or bad JSON): the exact scan decides
        if len(self.buf) < self.exact_at:
            return  # the last exact scan found no cut: wait until the buffer doubles, so scans stay linear
        self._events_exact(final=False)
        self.exact_at = 2 * len(self.buf)

    def _emit(self, end: int, exact: bool) -> None:
        """Decode buf[0:end] as the event list (buf[end] becomes ']'), then drop it from the buffer.

        ``exact``: the cut is known to end an event (bracket scan), so the decoder may skip the
        events it cannot read instead of failing; a guessed cut must decode strictly or not at all.
        """
        buf = self.buf
        first, last = buf[0], buf[end]
        buf[0], buf[end] = _OPEN_BRACKET, _CLOSE_BRACKET
        try:
            with memoryview(buf) as view:
                self.on_events(view[: end + 1], exact)
        finally:
            buf[0], buf[end] = first, last
        self.buf = buf[end:]  # the comma (or closing bracket) at ``end`` stays as the next first byte

    def _events_exact(self, final: bool) -> None:
        buf = self.buf
        if len(buf) <= 1:
            if final:
                raise DataError(self._truncated())
            return
        pos, ch, depth = _brackets(memoryview(buf)[1:], self.array_depth)
        pos = pos + 1
        closed = np.flatnonzero(depth < self.array_depth)
        if closed.size:
            k = int(closed[0])
            if ch[k] != _CLOSE_BRACKET:
                raise DataError(f"{self.path}: malformed JSON in traceEvents (unbalanced brackets)")
            end = int(pos[k])
            self._decode_or_fail(end)
            self.suffix.append(bytes(self.buf))  # starts with the list's closing bracket
            self.buf, self.state = bytearray(), "suffix"
            return
        ends = pos[(ch == _CLOSE_BRACE) & (depth == self.array_depth)]
        for e in ends[::-1][:2].tolist():
            j = e + 1
            while j < len(buf) and buf[j] in _WS:
                j += 1
            if j < len(buf) and buf[j] == _COMMA:
                self._decode_or_fail(j)
                break
        if final:
            raise DataError(self._truncated())

    def _decode_or_fail(self, end: int) -> None:
        self._emit(end, exact=True)

    def _truncated(self) -> str:
        return (
            f"{self.path}: trace is truncated "
            f"(the traceEvents list is not closed after {self.seen_bytes:,} bytes)"
        )

    def finish(self) -> bytes:
        """Check the stream ended cleanly; returns the top-level JSON with traceEvents emptied."""
        if self.state == "start":
            raise DataError(f"{self.path}: trace file is empty")
        if self.state == "prefix":
            self._prefix()
        if self.state == "prefix":
            raise DataError(f"{self.path}: trace is truncated or has no traceEvents list")
        if self.state == "events":
            self._events_exact(final=True)
        return self.prefix + b"".join(self.suffix)


# ------------------------------------------------------------------------------------------ columns

_get = {k: attrgetter(k) for k in ("ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args")}
_get_arg = {k: attrgetter(k) for k in ("correlation", "external_id", "seq", "stream", "device")}
_get_collective = attrgetter("collective")
_get_comm_fields = attrgetter(*_COMM_FIELDS)
_get_mem_fields = attrgetter(*_MEM_FIELDS)
_HW_GETTERS = {f: attrgetter(f) for f in _HW_FIELDS}
# categories whose events carry kernel resources or copy sizes
_HW_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})


_FIRST_BLOCK = 1 << 16  # rows in a column's first block: small traces stay small
_BLOCK = 1 << 20  # rows in later blocks: 8 MiB for int64, large enough for malloc to mmap them


class _Column:
    """One growing column kept in a few large blocks.

    Why blocks rather than a list of per-chunk arrays: many small long-lived arrays interleave with
    each chunk's short-lived Python objects on the malloc heap, and that fragmentation roughly
    doubled the peak resident memory. Large blocks are mapped on their own and given back on free.
    """

    __slots__ = ("dtype", "blocks", "fill", "rows")

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype
        self.blocks: list[np.ndarray] = []
        self.fill = 0  # rows used in the last block
        self.rows = 0

    def add(self, arr: np.ndarray) -> None:
        i, n = 0, len(arr)
        while i < n:
            if not self.blocks or self.fill == len(self.blocks[-1]):
                self.blocks.append(np.empty(_BLOCK if self.blocks else _FIRST_BLOCK, dtype=self.dtype))
                self.fill = 0
            block = self.blocks[-1]
            k = min(n - i, len(block) - self.fill)
            block[self.fill : self.fill + k] = arr[i : i + k]
            self.fill += k
            i += k
        self.rows += n

    def take(self, inverse: np.ndarray | None = None) -> np.ndarray:
        """The whole column (rows moved to ``inverse[i]`` when given); frees the blocks as it goes."""
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

    def add(self, name: str, arr: np.ndarray) -> None:
        self.cols[name].add(arr)

    def take(self, name: str, inverse: np.ndarray | None = None) -> np.ndarray:
        return self.cols[name].take(inverse)


@dataclass
class _Coded:
    """Values of an id column that are not 64-bit integers ("Spans", "0x1f", ...): rows and text."""

    rows: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class _Chunk:
    """One run of events decoded on its own: columns with codes local to the chunk.

    A chunk depends on nothing but its bytes, so chunks can be decoded in any process and in any
    order; :class:`_Merger` then maps the local codes (names, categories, phases, text ids) to the
    trace's and appends the columns in file order.
    """

    n_raw: int = 0  # events decoded
    skipped: int = 0  # list items that could not be read as events
    repaired_utf8: int = 0  # events read after replacing invalid UTF-8
    first_problem: str | None = None
    out_of_range: dict[str, int] = field(default_factory=dict)  # field -> odd integers read as absent
    names: list[Any] = field(default_factory=list)  # local code -> name
    cats: list[Any] = field(default_factory=list)
    phs: list[Any] = field(default_factory=list)
    x: dict[str, np.ndarray] = field(default_factory=dict)  # complete events' columns
    x_coded: dict[str, _Coded] = field(default_factory=dict)
    fl: dict[str, np.ndarray] = field(default_factory=dict)  # flow events' columns
    fl_coded: dict[str, _Coded] = field(default_factory=dict)
    comm_rows: list[int] = field(default_factory=list)  # complete-event rows with collective parameters
    comm_values: list[tuple[Any, ...]] = field(default_factory=list)
    hw_rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    hw_cols: dict[str, list[Any]] = field(default_factory=dict)
    memory: list[tuple[Any, ...]] = field(default_factory=list)  # [memory] events: ts, pid, tid + _MEM_FIELDS


def _decode_chunk(payload: bytes | memoryview, exact: bool) -> _Chunk:
    """Decode one JSON list of events into a :class:`_Chunk`.

    Not ``exact``: decoding errors propagate (the splitter judges its guessed cut by them).
    ``exact``: when the list as a whole cannot be decoded, each event is decoded on its own and the
    ones that still fail are skipped and counted (see :func:`_one_by_one`).
    """
    ch = _Chunk()
    try:
        events = _EVENTS_DECODER.decode(payload)
    except _DECODE_ERRORS:
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
        ch.memory = [(e.ts, e.pid, e.tid, *_get_mem_fields(e.args or _NO_ARGS)) for e in mem]
    ch.names, ch.cats = list(names), list(cats)
    return ch


def _complete_columns(ch: _Chunk, xs: list[_Event], names: dict[Any, int], cats: dict[Any, int]) -> None:
    name_codes = _codes(names, list(map(_get["name"], xs)))
    cat_codes = _codes(cats, list(map(_get["cat"], xs)))
    args = list(map(_get["args"], xs))
    if None in args:
        args = [a if a is not None else _NO_ARGS for a in args]
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
    comm_codes = [c for n, c in names.items() if _may_carry_comms(n)]
    for i in np.flatnonzero(np.isin(name_codes, comm_codes)).tolist():
        if args[i].collective is not None:
            ch.comm_rows.append(i)
            ch.comm_values.append(_get_comm_fields(args[i]))
    device_codes = [c for k, c in cats.items() if isinstance(k, str) and k.lower() in _HW_CATS]
    dev_idx = np.flatnonzero(np.isin(cat_codes, device_codes))
    ch.hw_rows = dev_idx.astype(np.int64)
    dev_args = [args[i] for i in dev_idx.tolist()]
    ch.hw_cols = {f: list(map(get, dev_args)) for f, get in _HW_GETTERS.items()}


def _may_carry_comms(name: Any) -> bool:
    """Events that may carry collective parameters: record_param_comms, NCCL/RCCL kernels."""
    low = str(name).lower()
    return "record_param_comms" in low or "nccl" in low or "rccl" in low or "comm" in low


def _one_by_one(payload: bytes | memoryview, ch: _Chunk) -> list[_Event]:
    """Decode the items of a JSON list one at a time; skip (and count) those that fail.

    Items are found by a bracket scan, so one bad event costs only itself. An item with invalid
    UTF-8 is read again with the bad bytes replaced by U+FFFD (and counted as repaired).
    """
    out: list[_Event] = []
    for item in _list_items(payload):
        try:
            out.append(_EVENT_DECODER.decode(item))
            continue
        except UnicodeDecodeError:
            try:
                out.append(_EVENT_DECODER.decode(bytes(item).decode("utf-8", "replace").encode()))
                ch.repaired_utf8 += 1
                continue
            except _DECODE_ERRORS as exc:
                problem: BaseException = exc
        except _DECODE_ERRORS as exc:
            problem = exc
        ch.skipped += 1
        if ch.first_problem is None:
            ch.first_problem = _describe(problem)
    return out


def _codes(table: dict[Any, int], values: list[Any]) -> np.ndarray:
    codes = [table.setdefault(v, len(table)) for v in values]
    return np.fromiter(codes, dtype=np.int32, count=len(codes))


def _ints(
    ch: _Chunk, xs: list[Any], get: Callable[[Any], Any], none: int, field: str, coded: dict[str, _Coded] | None
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
    for i in [i for i, v in enumerate(values) if v.__class__ is not int or not -_MAX_INT <= v < _MAX_INT]:
        v = values[i]
        parsed = none if v is None or v == "" else _parse_int(str(v))
        if parsed is None:
            if coded is None:
                ch.out_of_range[field] = ch.out_of_range.get(field, 0) + 1
                parsed = none
            else:
                c = coded.setdefault(field, _Coded())
                c.rows.append(i)
                c.text.append(str(v)[:200])
                parsed = 0  # replaced by the trace-wide code when merged
        values[i] = parsed
    return np.array(values, dtype=np.int64)


def _parse_int(s: str) -> int | None:
    """An integer written as text ("42", "0x1f", "3.0"), or None when not a 64-bit integer."""
    if len(s) <= 40:  # int() of a huge digit string is slow and never a valid id anyway
        for parse in (lambda: int(s, 0), lambda: int(float(s))):
            try:
                v = parse()
            except (ValueError, OverflowError):
                continue
            if -_MAX_INT <= v < _MAX_INT:
                return v
            break
    return None


class _Merger:
    """Appends chunks in file order, mapping their local codes to trace-wide ones."""

    def __init__(self) -> None:
        i64, f64, i32 = np.int64, np.float64, np.int32
        self.x = _Columns(
            {"name": i32, "cat": i32, "pid": i64, "tid": i64, "ts": f64, "dur": f64, **{k: i64 for k in _get_arg}}
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
        self.hw_cols: dict[str, list[Any]] = {f: [] for f in _HW_FIELDS}
        self.memory: list[tuple[Any, ...]] = []
        self.meta_json = b""  # the top-level JSON without its events (parallel decoding keeps it here)
        self.comms: pd.DataFrame = _empty_comms()  # replaced when the columns are finished
        self.hw: pd.DataFrame = _hw_frame(np.empty(0, dtype=np.int64), {}, np.empty(0, dtype=bool))

    def add(self, ch: _Chunk) -> None:
        self.n_raw += ch.n_raw
        self.skipped += ch.skipped
        self.repaired_utf8 += ch.repaired_utf8
        if self.first_problem is None:
            self.first_problem = ch.first_problem
        for k, n in ch.out_of_range.items():
            self.out_of_range[k] = self.out_of_range.get(k, 0) + n
        cats = self._remap(self.cats, ch.cats)
        if ch.x:
            base = self.x.cols["pid"].rows
            self._append(self.x, ch.x, {"name": self._remap(self.names, ch.names), "cat": cats}, ch.x_coded)
            self.comm_raw += [base + r for r in ch.comm_rows]
            self.comm_values += ch.comm_values
            if ch.hw_rows.size:
                self.hw_raw.append(base + ch.hw_rows)
                for f in _HW_FIELDS:
                    self.hw_cols[f] += ch.hw_cols[f]
        if ch.fl:
            self._append(self.fl, ch.fl, {"ph": self._remap(self.phs, ch.phs), "cat": cats}, ch.fl_coded)
        self.memory += ch.memory

    def _append(
        self, into: _Columns, cols: dict[str, np.ndarray], recode: dict[str, np.ndarray], coded: dict[str, _Coded]
    ) -> None:
        """Append a chunk's columns, its local codes replaced through ``recode`` (column -> map)."""
        cols = {k: recode[k][v] if k in recode else v for k, v in cols.items()}
        self._code_ids(cols, coded)
        for k, v in cols.items():
            into.add(k, v)

    @staticmethod
    def _remap(table: dict[Any, int], local: list[Any]) -> np.ndarray:
        return np.array([table.setdefault(v, len(table)) for v in local], dtype=np.int32)

    def _code_ids(self, cols: dict[str, np.ndarray], coded: dict[str, _Coded]) -> None:
        # Non-numeric or out-of-range ids ("Spans", "stream 7 ...", 2**64): stable negative codes,
        # names kept in meta, so distinct threads stay distinct.
        for fld, c in coded.items():
            col = cols[fld] = cols[fld].copy()
            col[c.rows] = [self.id_codes.setdefault(s, -1000 - len(self.id_codes)) for s in c.text]


def _floats(items: list[Any], get: Callable[[Any], Any]) -> np.ndarray:
    try:
        out = np.fromiter(map(get, items), dtype=np.float64, count=len(items))
    except (TypeError, ValueError):
        out = np.array([_to_float(v) for v in map(get, items)], dtype=np.float64)
    if np.isnan(out).any():  # null timestamps / durations count as 0, like absent ones
        out[np.isnan(out)] = 0.0
    return out


def _to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def _categorical(codes: np.ndarray, table: dict[Any, int], lower: bool = False) -> pd.Categorical:
    labels = []
    for k in table:  # insertion order == code order
        s = "" if k is None else (k if isinstance(k, str) else str(k))
        labels.append(s.lower() if lower else s)
    if len(set(labels)) != len(labels):  # e.g. "Kernel" and "kernel": merge their codes
        uniq, remap = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
        codes = remap.astype(np.int32)[codes] if codes.size else codes
        labels = list(uniq)
    return pd.Categorical.from_codes(codes, categories=pd.Index(labels, dtype=object))


# --------------------------------------------------------------------------------------------- load


def load_trace(path: str | Path, workers: int | None = None) -> TraceTable:
    """Parse a trace file into a :class:`TraceTable`, or raise DataError naming the problem.

    A trace that can mostly be read is loaded and ``TraceTable.notes`` says what was skipped or
    repaired (unreadable events, invalid UTF-8, out-of-range integers or times, unreadable
    top-level fields). One where most events cannot be read is a DataError.

    ``workers``: processes that decode chunks of a large file in parallel (default: see
    :func:`decode_workers`); the table is the same whatever the number.
    """
    p = Path(path)
    n = decode_workers(p) if workers is None else workers
    parallel = _decode_parallel(p, n) if n > 1 else None  # None also when a guessed cut was wrong
    if parallel is not None:
        return _table(p, parallel, parallel.meta_json)
    merged = _Merger()
    meta_json = _split(p, lambda view, exact: merged.add(_decode_chunk(view, exact)))
    return _table(p, merged, meta_json)


# Files below this size are decoded in-process: starting workers costs more than it saves.
PARALLEL_MIN_BYTES = 64 << 20
_IN_FLIGHT_PER_WORKER = 4  # chunks queued per worker: bounds memory, keeps workers busy (2 left them idle)


def decode_workers(path: Path) -> int:
    """How many processes decode ``path``: 1 for small files (by their decompressed size when
    gzipped), else the usable cores (at most 4).

    ``LMPROF_TRACE_WORKERS`` overrides (1 turns parallel decoding off). Parallel decoding needs the
    ``fork`` start method (Linux); elsewhere chunks are decoded in-process.
    """
    env = os.environ.get("LMPROF_TRACE_WORKERS", "").strip()
    if env.isdigit():
        return max(1, int(env))
    if sys.platform != "linux":
        return 1
    try:
        size = max(path.stat().st_size, _gzip_size(path))
    except OSError:
        return 1
    if size < PARALLEL_MIN_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 4))


def _gzip_size(path: Path) -> int:
    """The decompressed size a gzip file's trailer records (modulo 4 GiB), or 0 for other files."""
    with open_regular(path) as f:
        if f.read(2) != b"\x1f\x8b":
            return 0
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


class _Rollback(Exception):
    """A guessed cut decoded badly in a worker: the order-dependent fallback must run instead."""


def _decode_parallel(p: Path, workers: int) -> _Merger | None:
    """Decode chunks in worker processes, merged in file order; None when a guessed cut was wrong.

    The splitter's cheap guesses are checked by decoding them; in-process a bad guess is repaired
    on the spot, but here its chunk is already out with a worker, so the whole load is redone
    in-process (rare: it needs ``},`` inside a string right where a read ends). A worker that dies
    (killed for memory, ...) also makes the load run again in-process.
    """
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    merged = _Merger()
    pending: deque[tuple[Future[_Chunk], bool]] = deque()

    def collect(item: tuple[Future[_Chunk], bool]) -> None:
        fut, exact = item
        try:
            merged.add(fut.result())
        except _DECODE_ERRORS:
            if exact:
                raise
            raise _Rollback from None

    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:

        def submit(view: memoryview, exact: bool) -> None:
            pending.append((pool.submit(_decode_chunk, bytes(view), exact), exact))
            while len(pending) > workers * _IN_FLIGHT_PER_WORKER:
                collect(pending.popleft())

        try:
            merged.meta_json = _split(p, submit)
            while pending:
                collect(pending.popleft())
        except (_Rollback, BrokenProcessPool):
            # a bad guess, or a worker that died (killed for memory, ...): decode in-process instead
            for fut, _ in pending:
                fut.cancel()
            return None
    return merged


def _split(p: Path, on_events: Callable[[memoryview, bool], None]) -> bytes:
    """Feed the file through a :class:`_Splitter`; returns the top-level JSON without its events."""
    splitter = _Splitter(p, on_events)
    for chunk in _chunks(p):
        splitter.feed(chunk)
    return splitter.finish()


def _table(p: Path, builder: _Merger, meta_json: bytes) -> TraceTable:
    notes: list[str] = []
    top = _Meta()
    try:
        if meta_json[:1] == b"[":
            _LIST_META_DECODER.decode(meta_json)
        else:
            top = _META_DECODER.decode(meta_json)
    except _DECODE_ERRORS as exc:
        if builder.n_raw == 0:
            raise DataError(f"{p}: not a valid trace JSON ({_describe(exc)})") from None
        notes.append(f"top-level fields outside traceEvents could not be read ({_describe(exc)}): ignored")
    _check_skipped(p, builder)
    events, flows, dropped = _frames(builder)
    if events.empty:
        what = "no events" if builder.n_raw == 0 else "no complete ('ph': 'X') events"
        raise DataError(f"{p}: trace has {what}")
    notes += _load_notes(builder, dropped)
    meta: dict[str, Any] = {
        "distributedInfo": top.distributedInfo,
        "deviceProperties": top.deviceProperties,
        "baseTimeNanoseconds": top.baseTimeNanoseconds,
        "schemaVersion": top.schemaVersion,
        "traceName": top.traceName,
        "id_codes": {v: k for k, v in builder.id_codes.items()},
    }
    info = top.distributedInfo
    if isinstance(info, dict) and "rank" in info and parse_rank(info) is None:
        notes.append(f"distributedInfo.rank is not a valid rank ({_short_repr(info.get('rank'))}): ignored")
    return TraceTable(
        events=events, flows=flows, meta=meta, path=str(p), notes=notes, comms=builder.comms, hw=builder.hw,
        memory=_memory_frame(builder.memory),
    )


def _check_skipped(p: Path, b: _Merger) -> None:
    """Too many unreadable events: the file is not a trace we can stand behind."""
    if b.skipped and b.n_raw == 0:
        raise DataError(
            f"{p}: no trace event could be read ({b.skipped:,} unexpected trace event(s), "
            f"first: {b.first_problem})"
        )
    if b.skipped > b.n_raw // 10 and b.skipped > 100:  # more than ~10% bad: too broken to trust
        raise DataError(
            f"{p}: {b.skipped:,} of {b.skipped + b.n_raw:,} trace events are unreadable "
            f"(first: {b.first_problem}); the file is too damaged to analyse"
        )


def _load_notes(b: _Merger, dropped: int) -> list[str]:
    notes = []
    if b.skipped:
        notes.append(
            f"{b.skipped:,} of {b.skipped + b.n_raw:,} trace events could not be read and were "
            f"skipped (first: {b.first_problem})"
        )
    if b.repaired_utf8:
        notes.append(f"{b.repaired_utf8:,} event(s) held invalid UTF-8: bad bytes replaced by U+FFFD")
    for fld, n in sorted(b.out_of_range.items()):
        notes.append(f"{n:,} event(s) have {fld} that is not a 64-bit integer: read as absent")
    if dropped:
        notes.append(f"{dropped:,} event(s) with a timestamp or duration out of range were left out")
    return notes


def _short_repr(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


_MAX_TIME_US = 1e18  # 31,000 years: beyond this a timestamp or duration is junk


def _empty_comms() -> pd.DataFrame:
    return _comms_frame(np.empty(0, dtype=np.int64), [], np.empty(0, dtype=bool))


def _comms_frame(rows: np.ndarray, values: list[tuple[Any, ...]], keep: np.ndarray) -> pd.DataFrame:
    """Collective parameters as typed columns: ints (-1 when absent or odd), names as str ("" absent)."""
    values = [v for v, k in zip(values, keep.tolist()) if k]
    rows = rows[keep]
    order = np.argsort(rows, kind="stable")
    values = [values[i] for i in order.tolist()]
    cols: dict[str, Any] = {"row": rows[order]}
    for j, f in enumerate(_COMM_FIELDS):
        column = [v[j] for v in values]
        if f in ("collective", "dtype", "pg_name"):
            cols[f] = pd.array([_short_str(x) for x in column], dtype=object)
        else:
            cols[f] = np.array([_small_int(x) for x in column], dtype=np.int64)
    return pd.DataFrame(cols)


def _hw_frame(rows: np.ndarray, values: dict[str, list[Any]], keep: np.ndarray) -> pd.DataFrame:
    """Kernel resources and copy sizes as float columns (NaN when absent or not a finite number >= 0).

    Rows of device events without any of them (no registers and no bytes) are dropped.
    """
    order = np.argsort(rows[keep], kind="stable")
    cols: dict[str, Any] = {"row": rows[keep][order]}
    for f in _HW_FIELDS:
        raw = values.get(f, [])
        try:  # fast path: numbers and None only
            col = np.array([np.nan if x is None else x for x in raw], dtype=np.float64)
            col[~(np.isfinite(col) & (col >= 0))] = np.nan
        except (TypeError, ValueError, OverflowError):
            col = np.array([_number(x) for x in raw], dtype=np.float64)
        if col.size != rows.size:  # a chunk lost its values: keep the frame consistent
            col = np.full(rows.size, np.nan)
        cols[f] = col[keep][order]
    out = pd.DataFrame(cols)
    return out[out["registers"].notna() | out["nbytes"].notna()].reset_index(drop=True)


_MEMORY_COLUMNS = ("device_type", "device_id", "bytes", "addr", "ev_idx", "total_allocated", "total_reserved")


def _memory_frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """The allocator events as typed columns (see the module docstring)."""
    cols: dict[str, Any] = {
        "ts": np.array([_to_float(r[0]) for r in rows], dtype=np.float64),
        "pid": np.array([_any_int(r[1], 0) for r in rows], dtype=np.int64),
        "tid": np.array([_any_int(r[2], 0) for r in rows], dtype=np.int64),
    }
    for j, name in enumerate(_MEMORY_COLUMNS):
        absent = 0 if name == "bytes" else -1
        cols[name] = np.array([_any_int(r[3 + j], absent) for r in rows], dtype=np.int64)
    return pd.DataFrame(cols)


def _any_int(x: Any, absent: int) -> int:
    """An int64 from a JSON value (int, integral float, decimal or hex text), else ``absent``."""
    if isinstance(x, bool) or x is None:
        return absent
    if isinstance(x, float):
        return int(x) if x.is_integer() and abs(x) < _MAX_INT else absent
    if isinstance(x, str):
        v = _parse_int(x.strip())
        return absent if v is None else v
    return x if isinstance(x, int) and -_MAX_INT <= x < _MAX_INT else absent


def _number(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return np.nan
    f = float(x) if abs(x) < 1e30 else np.nan
    return f if np.isfinite(f) and f >= 0 else np.nan


def _short_str(x: Any) -> str:
    return "" if x is None or isinstance(x, (list, dict)) else str(x)[:200]


def _small_int(x: Any) -> int:
    if isinstance(x, bool) or x is None:
        return -1
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, str) and x.strip().isdigit() and len(x.strip()) < 19:
        x = int(x.strip())
    return x if isinstance(x, int) and 0 <= x < _MAX_INT else -1


def _frames(b: _Merger) -> tuple[pd.DataFrame, pd.DataFrame, int]:
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
    cols: dict[str, Any] = {
        "name": _categorical(x.take("name", inverse), b.names),
        "cat": _categorical(x.take("cat", inverse), b.cats, lower=True),
        "pid": x.take("pid", inverse),
        "tid": x.take("tid", inverse),
        "ts": ts,
        "dur": x.take("dur", inverse),
    }
    for name in _get_arg:
        cols[name] = x.take(name, inverse)
    comm_rows = np.asarray(b.comm_raw, dtype=np.int64)
    hw_rows = np.concatenate(b.hw_raw) if b.hw_raw else np.empty(0, dtype=np.int64)
    if inverse is not None:
        comm_rows, hw_rows = inverse[comm_rows], inverse[hw_rows]
    del inverse
    bad_dur = ~(np.abs(cols["dur"]) <= _MAX_TIME_US)
    keep = np.isfinite(cols["ts"]) & ~bad_dur
    dropped = int(len(keep) - keep.sum())
    comm_keep = np.ones(comm_rows.size, dtype=bool)
    hw_keep = np.ones(hw_rows.size, dtype=bool)
    if dropped:
        cols = {k: v[keep] for k, v in cols.items()}
        new_row = np.cumsum(keep) - 1
        comm_keep, hw_keep = keep[comm_rows], keep[hw_rows]
        comm_rows, hw_rows = new_row[comm_rows], new_row[hw_rows]
    b.comms = _comms_frame(comm_rows, b.comm_values, comm_keep)
    b.hw = _hw_frame(hw_rows, b.hw_cols, hw_keep)
    events = pd.DataFrame(cols, copy=False)
    f = b.fl
    flows = pd.DataFrame(
        {
            "id": f.take("id"),
            "ph": _categorical(f.take("ph"), b.phs),
            "cat": _categorical(f.take("cat"), b.cats, lower=True),
            "pid": f.take("pid"),
            "tid": f.take("tid"),
            "ts": f.take("ts"),
        },
        copy=False,
    )
    return events, flows, dropped
