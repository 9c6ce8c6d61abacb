"""Bytes of a trace file: opened only if it is a regular file, gunzipped transparently, in pieces.

The file is never held whole: :func:`open_stream` gives a stream whose ``readinto`` fills a caller's
buffer with at most its size of decoded bytes, so a highly compressed trace never inflates at once,
and a plain file's bytes go from the kernel straight into the caller's buffer (one copy, made
without holding the GIL).
"""
from __future__ import annotations

import io
import os
import stat
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Protocol

from lmprof.errors import DataError

READ_BYTES = 2 << 20  # decoded bytes handled per step: bounds the transient Python objects
GZIP_IN = 1 << 20  # compressed bytes read per gunzip step



class Stream(Protocol):
    """What :func:`open_stream` gives: ``readinto`` fills ``b`` with the next decoded bytes."""

    def readinto(self, b: memoryview | bytearray, /) -> int: ...


@contextmanager
def open_stream(path: Path) -> Iterator[Stream]:
    """The decoded bytes of ``path`` as a :class:`Stream`; gunzips transparently."""
    f = open_regular(path)
    with f:
        head = f.peek(2)[:2]
        yield _Gunzip(f, path) if head == b"\x1f\x8b" else f


def open_regular(path: Path) -> io.BufferedReader:
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


class _Gunzip:
    """A gzip file (concatenated members allowed, junk after the last ignored as gzip(1) does) as a
    :class:`Stream`: each ``readinto`` inflates at most the buffer's size."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path
        self.d = zlib.decompressobj(wbits=31)
        self.data = b""
        self.done = False

    def readinto(self, b: memoryview | bytearray, /) -> int:
        while not self.done:
            if not self.data:
                self.data = self.f.read(GZIP_IN)
                if not self.data:
                    self.done = True
                    if not self.d.eof:
                        raise DataError(
                            f"{self.path}: gzip data is truncated (the file ends before the compressed stream does)"
                        )
                    break
            if self.d.eof:
                if self.data[:2] != b"\x1f\x8b":
                    self.done = True  # padding or junk after the last gzip member: ignored
                    break
                self.d = zlib.decompressobj(wbits=31)  # concatenated gzip members
            try:
                # max_length bounds each piece, so a highly compressed trace never inflates at once
                out = self.d.decompress(self.data, len(b))
            except zlib.error as exc:
                raise DataError(f"{self.path}: gzip data is corrupt ({exc})") from None
            self.data = self.d.unused_data if self.d.eof else self.d.unconsumed_tail
            if out:
                b[: len(out)] = out
                return len(out)
        return 0


def gzip_size(path: Path) -> int:
    """The decompressed size a gzip file's trailer records (modulo 4 GiB), or 0 for other files."""
    with open_regular(path) as f:
        if f.read(2) != b"\x1f\x8b":
            return 0
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def looks_like_snapshot(path: Path) -> bool:
    """A pickle (protocol 2 or later) by its first bytes, or a ``.pickle`` / ``.pkl`` name: a CUDA memory
    snapshot for :mod:`lmprof.trace.snapshot`. Here, not there, so that telling a trace from a snapshot
    imports neither pickle nor the snapshot reader (``lmprof analyze`` of a trace pays no start-up for it)."""
    if path.name.endswith((".pickle", ".pkl")):
        return True
    try:
        with open_regular(path) as f:
            head = f.read(2)
    except DataError:
        return False
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5
