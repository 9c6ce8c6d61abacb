"""Cutting a trace's byte stream into runs of complete events, without decoding it.

:class:`Splitter` takes the decoded bytes piece by piece and hands out JSON lists of complete events
(its docstring says how cuts are guessed and checked); :func:`brackets` and :func:`list_items` are
the vectorised scans of brackets and quotes outside strings that the exact cuts rely on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from lmprof.errors import DataError
from lmprof.trace import read
from lmprof.trace.read import Stream

_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[list(b'{}[]"')] = True
_OPEN_BRACE, _CLOSE_BRACE, _OPEN_BRACKET, _CLOSE_BRACKET, _QUOTE, _BACKSLASH, _COMMA = b"{}[]\"\\,"
_WS = b" \t\r\n"
# The most bytes held while no event ends (one event, the metadata before the event list, or all
# that comes after it). Real events are at most kilobytes and the buffer is normally cut every
# ~2 MiB read; a hostile file (one 2 GiB string, a 1 GiB hole of zeros) stops here. The bracket
# scan over a held buffer takes up to ~40 bytes per byte (all quotes), so this keeps any file under
# about 1 GB (measured: docs/reliability-traces.md).
MAX_HELD_BYTES = 16 << 20
_PREFIX_WINDOW = 64 << 10  # bytes of the first window searched for the traceEvents list
_FIRST_READ = 64 << 10  # bytes of the first piece read (see Splitter.read_all)


def _outside_strings(a: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions and bytes of ``a`` where ``wanted`` holds (quotes must be wanted), outside strings.

    ``a`` must start outside any string. String state is the parity of the unescaped quotes seen.
    """
    idx = np.flatnonzero(wanted)
    ch = a[idx]
    is_quote = ch == _QUOTE
    q = idx[is_quote]
    maybe_escaped = q[(q > 0) & (a[np.maximum(q - 1, 0)] == _BACKSLASH)]
    if maybe_escaped.size:  # rare: count the backslash run before each such quote
        escaped = [p for p in maybe_escaped.tolist() if _odd_backslashes(a, p)]
        if escaped:
            is_quote &= ~np.isin(idx, escaped)
    # uint8 cumsum wraps at 256, which keeps the parity we need
    keep = ((np.cumsum(is_quote, dtype=np.uint8) & 1) == 0) & (ch != _QUOTE)
    return idx[keep], ch[keep]


def brackets(buf: bytes | bytearray | memoryview, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions, characters and depth-after of every bracket of ``buf`` that is outside a string.

    ``buf`` must start outside any string at nesting depth ``depth0``. Vectorised: only the bytes
    { } [ ] and unescaped quotes are looked at.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    pos, ch = _outside_strings(a, _STRUCTURAL[a])
    delta = np.where((ch == _OPEN_BRACE) | (ch == _OPEN_BRACKET), 1, -1).astype(np.int32)
    depth = depth0 + np.cumsum(delta, dtype=np.int32)
    return pos, ch, depth


def list_items(payload: bytes | memoryview) -> list[memoryview]:
    """The items of the JSON list ``payload`` (``[a, b, ...]``) as slices, found without decoding.

    Items are split at the commas at depth 1 outside strings; what an item holds is not checked
    (that is the decoder's job), so a malformed item is one slice the caller can skip.
    """
    view = memoryview(payload)
    a = np.frombuffer(view, dtype=np.uint8)
    if a.size < 2:
        return []
    pos, ch = _outside_strings(a, _STRUCTURAL[a] | (a == _COMMA))
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


def _odd_backslashes(a: np.ndarray, p: int) -> bool:
    n = 0
    while p - 1 - n >= 0 and a[p - 1 - n] == _BACKSLASH:
        n += 1
    return n % 2 == 1


class Splitter:
    """Reads decoded bytes; hands out JSON lists of complete events and keeps the rest as metadata.

    States: ``start``, ``prefix`` until the traceEvents list opens, ``events`` inside it, ``suffix``
    after it. In ``events`` the buffer always begins with the list's ``[`` or the comma before the
    next event, so a run of complete events becomes a JSON list in place: that first byte is set to
    ``[`` and the comma after the run to ``]``, and msgspec decodes the slice without a copy.

    Cuts are first guessed cheaply (the last ``}`` followed by a comma); a wrong guess always makes
    invalid JSON (an open string or unbalanced brackets), and then the exact vectorised bracket scan
    decides. Only the prefix, a failed guess and the final piece are ever scanned.
    """

    def __init__(
        self,
        path: Path,
        on_events: Callable[[memoryview, bool], None],
        bad_guess: tuple[type[BaseException], ...] = (),
    ) -> None:
        # bad_guess: what on_events raises when a guessed cut does not decode (then the exact scan runs)
        self.path = path
        self.on_events = on_events
        self.bad_guess = bad_guess
        self.state = "start"
        self.buf = bytearray()
        self.prefix = b""
        self.suffix: list[bytes] = []
        self.suffix_bytes = 0
        self.array_depth = 0
        self.seen_bytes = 0
        self.exact_at = 0  # buffer length from which the next exact scan runs
        self.prefix_at = 0  # same for the prefix scan

    def read_all(self, stream: Stream) -> None:
        """Read ``stream`` to its end in pieces doubling from 64 KiB to
        :data:`lmprof.trace.read.READ_BYTES`: each piece's buffer is allocated whole before the read,
        so a small trace read in 2 MiB pieces paid for 2 MiB buffers it did not fill."""
        size = min(_FIRST_READ, read.READ_BYTES)
        while self.fill(stream, size):
            size = min(2 * size, read.READ_BYTES)

    def fill(self, stream: Stream, size: int) -> bool:
        """Read up to ``size`` more bytes from ``stream`` straight in after the held ones; False at
        its end. For a plain file the read itself is the only copy, made without the GIL: copying
        each piece read into the buffer held the GIL for a copy of the whole file, 37% of the main
        thread's GIL time (the 259 MB benchmark trace) while decoding threads waited on it."""
        if self.state == "suffix":
            piece = bytearray(size)
            n = stream.readinto(piece)
            if n:
                self.seen_bytes += n
                self._suffix(bytes(piece[:n]))
            return n > 0
        held = len(self.buf)
        grown = bytearray(held + size)
        grown[:held] = self.buf
        view = memoryview(grown)
        try:
            n = stream.readinto(view[held:])
        finally:
            view.release()  # else the buffer could not shrink below
        if not n:
            return False
        self.seen_bytes += n
        self._check_held(held + n)
        del grown[held + n :]
        self.buf = grown
        self._advance()
        return True

    def _suffix(self, chunk: bytes) -> None:
        self.suffix_bytes += len(chunk)
        if self.suffix_bytes > MAX_HELD_BYTES:
            raise DataError(self._too_long("after the traceEvents list"))
        self.suffix.append(chunk)

    def _check_held(self, n: int) -> None:
        if n > MAX_HELD_BYTES:
            where = "in one event" if self.state == "events" else "before the traceEvents list"
            raise DataError(self._too_long(where))

    def _advance(self) -> None:
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
            if bytes(self.buf[1:64]).lstrip(_WS).startswith(b'"rocprofiler-sdk-tool"'):
                raise DataError(f"{self.path}: a rocprofv3 (rocprofiler-sdk) JSON result, not a torch.profiler "
                                "trace: lmprof reads torch.profiler's JSON (which ROCm's PyTorch writes too) and "
                                "Nsight Systems exports")
            self.state = "prefix"
        else:
            protobuf = " (a protobuf trace: Perfetto's or XPlane's, JAX's and TensorFlow's, which lmprof does not read)"
            raise DataError(
                f"{self.path}: not a JSON trace (it starts with {bytes(first)!r}, expected '{{' or '[')"
                + (protobuf if self.path.name.lower().endswith((".pb", ".pftrace", ".perfetto-trace")) else "")
            )

    def _prefix(self) -> None:
        # a window from the start, doubled until the list is found: the metadata before the events
        # is kilobytes, and scanning the whole first 2 MiB read for it took 14 ms while every
        # decoding thread waited for its first run of events
        n = len(self.buf)
        window = min(n, _PREFIX_WINDOW)
        while True:
            pos, ch, depth = brackets(self.buf[:window], 0)
            for p in pos[(ch == _OPEN_BRACKET) & (depth == 2)].tolist():
                before = bytes(self.buf[max(0, p - 64) : p]).rstrip(_WS)
                if before.endswith(b":") and before[:-1].rstrip(_WS).endswith(b'"traceEvents"'):
                    self.prefix = bytes(self.buf[: p + 1])
                    del self.buf[:p]  # keep the "[" as the buffer's first byte
                    self.array_depth, self.state = 2, "events"
                    return
            if (depth <= 0).any():
                raise DataError(f"{self.path}: JSON has no traceEvents list (not a Kineto / Chrome trace)")
            if window == n:
                return
            window = min(n, 2 * window)

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
            except self.bad_guess:
                pass  # a wrong guess (or bad JSON): the exact scan decides
        if len(self.buf) < self.exact_at:
            return  # the last exact scan found no cut: wait until the buffer doubles, so scans stay linear
        self._events_exact(final=False)
        self.exact_at = 2 * len(self.buf)

    def _emit(self, end: int, exact: bool) -> None:
        """Decode buf[0:end] as the event list (buf[end] becomes ']'), then drop it from the buffer.

        ``exact``: the cut is known to end an event (bracket scan), so the decoder may skip the
        events it cannot read instead of failing; a guessed cut must decode strictly or not at all.

        Once ``on_events`` returns, the view it was given is its own: the splitter goes on in a new
        buffer and never writes to that one again, so a consumer may keep the view (a worker thread
        decoding it later) without copying it. Copying each run cost the main thread a copy of the
        whole file while the workers waited on it.
        """
        buf = self.buf
        rest = buf[end:]  # the comma (or closing bracket) at ``end`` stays as the next first byte
        first, last = buf[0], buf[end]
        buf[0], buf[end] = _OPEN_BRACKET, _CLOSE_BRACKET
        view = memoryview(buf)[: end + 1]
        try:
            self.on_events(view, exact)
        except BaseException:
            view.release()  # the exact scan may read this buffer again, and the next read grow it
            buf[0], buf[end] = first, last
            raise
        self.buf = rest

    def _events_exact(self, final: bool) -> None:
        buf = self.buf
        if len(buf) <= 1:
            if final:
                raise DataError(self._truncated())
            return
        pos, ch, depth = brackets(memoryview(buf)[1:], self.array_depth)
        pos = pos + 1
        closed = np.flatnonzero(depth < self.array_depth)
        if closed.size:
            k = int(closed[0])
            if ch[k] != _CLOSE_BRACKET:
                raise DataError(f"{self.path}: malformed JSON in traceEvents (unbalanced brackets)")
            end = int(pos[k])
            self._decode_or_fail(end)
            self.suffix.append(bytes(self.buf))  # starts with the list's closing bracket
            self.suffix_bytes += len(self.buf)
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

    def _too_long(self, where: str) -> str:
        return (f"{self.path}: more than {MAX_HELD_BYTES >> 20} MiB {where} with no event boundary "
                f"(after {self.seen_bytes:,} decoded bytes): not a trace lmprof reads (the limit keeps a "
                "hostile file from exhausting memory)")

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
