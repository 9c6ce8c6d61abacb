"""The ``lmprof`` command's standard output and error: any encoding, any reader that stops early.

lmprof prints names, units and tables with characters beyond ASCII (an em dash, ``x`` as a times
sign, ``µs``). Where the terminal or pipe cannot encode them (``LC_ALL=C`` with ``PYTHONUTF8=0``,
``PYTHONIOENCODING=cp1252``), Python's strict handler raised ``UnicodeEncodeError`` at the first one:
``compare``, ``analyze`` and ``train`` died, and a passing ``compare --fail-on`` gate exited 1, which
means "regression". A reader that stops early (``| head -1``) made the next write raise
``BrokenPipeError``: exit 1 again. So :func:`install` replaces both streams, once, by streams over
the same file descriptors that

* write a character the encoding lacks as its closest ASCII (an em dash as ``-``, the times sign as
  ``x``, ``µ`` as ``u``, accents dropped), else ``?``; a byte smuggled in by a file name that is not
  UTF-8 (a surrogate escape) is written back as that byte, as Python does on a C locale;
* when the reader has gone, point the descriptor at ``/dev/null`` and drop the rest: the command
  finishes, and its exit code keeps its meaning (a full disk is still an error: ``cli/main.py``).

``lmprof run`` is left alone: the user's script runs in this process and keeps Python's own streams.
"""
from __future__ import annotations

import codecs
import io
import os
import sys
import unicodedata
from typing import Any

ERRORS = "lmprof-closest-ascii"

# What NFKD decomposition does not bring to ASCII; everything else falls back to "?".
_ASCII = {
    "\u2014": "-", "\u2013": "-", "\u2012": "-", "\u2212": "-", "\u2010": "-", "\u2011": "-",
    "\u2026": "...", "\u00d7": "x", "\u00b5": "u", "\u03bc": "u", "\u00b7": ".", "\u2022": "*",
    "\u2192": "->", "\u2190": "<-", "\u2194": "<->", "\u21d2": "=>", "\u2264": "<=", "\u2265": ">=",
    "\u2248": "~", "\u2260": "!=", "\u00b1": "+-", "\u221e": "inf", "\u0394": "delta", "\u2191": "^",
    "\u2193": "v", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
    "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2502": "|", "\u2500": "-", "\u2713": "ok", "\u2717": "x",
    "\u00b0": " deg", "\u2030": " per mille", "\u00ad": "",
}


def closest_ascii(char: str) -> str:
    """The ASCII text that stands for ``char`` on a terminal that cannot show it ('?' when none)."""
    if char in _ASCII:
        return _ASCII[char]
    plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode("ascii")
    return plain or "?"


def _handler(exc: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    if all("\udc80" <= ch <= "\udcff" for ch in bad):  # surrogate escapes: the original bytes
        return bytes(ord(ch) - 0xDC00 for ch in bad), exc.end
    return "".join(closest_ascii(ch) for ch in bad), exc.end


codecs.register_error(ERRORS, _handler)


class _ReaderGone(io.FileIO):
    """A file descriptor's writer that, once the reader has closed the pipe, writes to /dev/null."""

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.fileno())
            finally:
                os.close(null)
            return memoryview(data).nbytes


def safe_stream(stream: Any) -> io.TextIOWrapper | None:
    """A text stream over ``stream``'s file descriptor, as :func:`install` sets it up; None when
    ``stream`` has no descriptor of its own (a test's capture, a closed stream)."""
    try:
        fd = stream.fileno()
        stream.flush()
    except (AttributeError, OSError, ValueError):
        return None
    raw = _ReaderGone(fd, "wb", closefd=False)
    buffered = io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=getattr(stream, "encoding", None) or "utf-8", errors=ERRORS,
                            line_buffering=bool(getattr(stream, "line_buffering", False)),
                            write_through=bool(getattr(stream, "write_through", False)))


def install() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` by :func:`safe_stream` s (the console command only)."""
    for name in ("stdout", "stderr"):
        new = safe_stream(getattr(sys, name))
        if new is not None:
            setattr(sys, name, new)
