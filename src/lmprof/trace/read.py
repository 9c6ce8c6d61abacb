"""Bytes of a trace file: opened only if it is a regular file, gunzipped transparently, in pieces.

The file is never held whole: :func:`chunks` yields at most about :data:`READ_BYTES` decoded bytes at
a time, so a highly compressed trace never inflates at once.
"""
from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from lmprof.errors import DataError

READ_BYTES = 2 << 20  # decoded bytes handled per step: bounds the transient Python objects
GZIP_IN = 1 << 20  # compressed bytes read per gunzip step



def chunks(path: Path) -> Iterator[bytes]:
    """Yield the decoded bytes of ``path`` in pieces of at most ~READ_BYTES; gunzips transparently."""
    f = open_regular(path)
    with f:
        head = f.read(2)
        if head != b"\x1f\x8b":
            yield head + f.read(max(READ_BYTES - 2, 0))
            while block := f.read(READ_BYTES):
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
                data = f.read(GZIP_IN)
                if not data:
                    break
            if d.eof:
                if data[:2] != b"\x1f\x8b":
                    break  # padding or junk after the last gzip member: ignored, as gzip(1) does
                d = zlib.decompressobj(wbits=31)  # concatenated gzip members
            # max_length bounds each piece, so a highly compressed trace never inflates at once
            out = d.decompress(data, READ_BYTES)
            if out:
                yield out
            data = d.unused_data if d.eof else d.unconsumed_tail
    except zlib.error as exc:
        raise DataError(f"{path}: gzip data is corrupt ({exc})") from None
    if not d.eof:
        raise DataError(f"{path}: gzip data is truncated (the file ends before the compressed stream does)")


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
