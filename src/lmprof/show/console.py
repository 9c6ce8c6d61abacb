"""A rich Console on a stream that belongs to the user's program: its stderr, as the program left it.

A program that shows a rich progress bar (``rich.progress.Progress``, Lightning's ``RichProgressBar``, any
``rich.live.Live``) has ``sys.stderr`` replaced by rich's ``FileProxy`` while the bar runs: what is written
to the proxy is printed above the bar. A Console given that proxy as its file unwraps it
(``rich_proxied_file``) and writes to the terminal beneath, past the bar: lmprof's summary began on the
bar's line and the bar was drawn again into the middle of it. Here the Console writes through the proxy.
"""
from __future__ import annotations

import io
from typing import Any, TextIO, cast

from rich.console import Console


def proxied(stream: TextIO) -> bool:
    """Whether ``stream`` is a rich display's proxy (a progress bar or live display is running on it)."""
    return getattr(stream, "rich_proxied_file", None) is not None


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` (or, for a proxy, the file beneath it) is a terminal."""
    try:
        return bool(getattr(stream, "rich_proxied_file", stream).isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Through(io.TextIOBase):
    """The proxy as a plain stream, which rich does not unwrap: writes go to the proxy, the rest to its file."""

    def __init__(self, proxy: TextIO) -> None:
        self._proxy = proxy
        self._beneath: TextIO = cast(Any, proxy).rich_proxied_file

    def write(self, s: str) -> int:
        self._proxy.write(s)
        return len(s)

    def flush(self) -> None:
        self._proxy.flush()

    def isatty(self) -> bool:
        return is_terminal(self._proxy)

    def fileno(self) -> int:
        return self._beneath.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # TextIOBase declares it, unset
        return getattr(self._beneath, "encoding", None) or "utf-8"


def console_on(stream: TextIO, *, width: int, **options: Any) -> Console:
    """A Console that writes to ``stream`` (through a rich proxy, when the program's bar put one there);
    ``width``: its width where the stream is no terminal (a terminal's own width otherwise)."""
    file = cast(TextIO, _Through(stream)) if proxied(stream) else stream
    return Console(file=file, width=None if is_terminal(stream) else width, **options)
