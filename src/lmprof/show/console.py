"""A rich Console on a stream that belongs to the user's program: its stderr, as the program left it.

A program that shows a rich progress bar (``rich.progress.Progress``, Lightning's ``RichProgressBar``, any
``rich.live.Live``) has ``sys.stderr`` replaced by rich's ``FileProxy`` while the bar runs: what is written
to the proxy is printed above the bar. A Console given that proxy as its file unwraps it
(``rich_proxied_file``) and writes to the terminal beneath, past the bar: lmprof's summary began on the
bar's line and the bar was drawn again into the middle of it. Here the Console writes through the proxy.
tqdm's bars (the HF Trainer's, a DataLoader loop's) are plain text on the stream: they are cleared while
lmprof writes and drawn again after it (:func:`beside_bars`).
"""
from __future__ import annotations

import contextlib
import io
import sys
from typing import TYPE_CHECKING, Any, Iterator, TextIO, cast

if TYPE_CHECKING:
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
    from rich.console import Console  # lazy: lmprof's one-line messages need no rich

    file = cast(TextIO, _Through(stream)) if proxied(stream) else stream
    return Console(file=file, width=None if is_terminal(stream) else width, **options)


@contextlib.contextmanager
def beside_bars(stream: TextIO) -> Iterator[None]:
    """Clear the script's tqdm bars while lmprof writes to ``stream``, and draw them again after (nothing
    when tqdm was never imported: lmprof does not import it)."""
    tqdm = sys.modules.get("tqdm")
    try:
        mode = tqdm.tqdm.external_write_mode(file=stream) if tqdm is not None else contextlib.nullcontext()
        mode.__enter__()
    except Exception:  # noqa: BLE001 - an odd tqdm (or none that works) only leaves the bars as they are
        mode = contextlib.nullcontext()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            mode.__exit__(None, None, None)
