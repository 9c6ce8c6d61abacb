"""The whole-run watch's live panel on stderr: step, tokens/s, loss, memory, input wait and the alerts.

On a terminal it is a small rich ``Live`` table redrawn at most every ``refresh_s``; elsewhere (a log
file, a pipe, a batch job's stderr) it is one plain line every ``every_s``. A new alert is always one
line of its own at once. It never touches stdout: ``Live`` is told not to redirect the program's
streams, so the script's output stays exactly its own. Everything from a record is printed as text
(rich markup off). Fed by the recorder's summaries; it computes no figure.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence, TextIO

from rich.table import Table
from rich.text import Text

from lmprof.record.run import WatchAlert
from lmprof.record.watch import StepSummary
from lmprof.show.console import console_on, is_terminal, proxied
from lmprof.show.format import human_bytes, number

PREFIX = "lmprof watch: "


def summary_fields(s: StepSummary) -> list[tuple[str, str]]:
    """(label, text) of each figure the step has, n/a ones left out."""
    out = [("step", f"{s.step:,}"), ("step time", number(s.step_s * 1e3, "ms"))]
    if s.device_s is not None:
        out.append(("device", number(s.device_s * 1e3, "ms")))
    if s.tokens_per_s is not None:
        out.append(("tokens/s", f"{s.tokens_per_s:,.0f}"))
    if s.loss is not None:
        out.append(("loss", f"{s.loss:.4g}"))
    if s.input_wait_s is not None:
        out.append(("input wait", number(s.input_wait_s * 1e3, "ms")))
    if s.mem_allocated_B is not None:
        reserved = f" / {human_bytes(s.mem_reserved_B)} reserved" if s.mem_reserved_B is not None else ""
        out.append(("memory", f"{human_bytes(s.mem_allocated_B)} allocated{reserved}"))
    if s.rss_B is not None:
        out.append(("RSS", human_bytes(s.rss_B)))
    return out


def summary_line(s: StepSummary, alerts: int = 0) -> str:
    """One plain line for a log."""
    parts = [f"{label} {text}" for label, text in summary_fields(s)]
    if alerts:
        parts.append(f"{alerts} alert{'s' if alerts != 1 else ''}")
    return PREFIX + " · ".join(parts)


def alert_line(a: WatchAlert) -> str:
    """One plain line for a new alert."""
    return f"{PREFIX}{a.kind.replace('_', ' ')} (steps {a.first_step}-{a.last_step}): {a.message}"


class WatchPanel:
    """Shows the latest step and the alerts; ``update`` is cheap when nothing is due."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, every_s: float = 30.0,
                 refresh_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        # a program's own rich bar on the stream: plain lines, printed above it (two live displays fight)
        self.live = (is_terminal(self.stream) and not proxied(self.stream)) if live is None else live
        self.every_s = every_s if not self.live else refresh_s
        self.clock = clock
        self._next = float("-inf")
        self._alerts: list[WatchAlert] = []
        self._console = console_on(self.stream, width=160, highlight=False, markup=False, emoji=False, soft_wrap=True)
        self._live: Any = None

    def update(self, summary: StepSummary | None, new_alerts: Sequence[WatchAlert] = ()) -> None:
        """The latest step (None: nothing new) and the alerts raised since the last update."""
        for a in new_alerts:
            self._alerts.append(a)
            self._say(alert_line(a))
        now = self.clock()
        if summary is None or now < self._next:
            return
        self._next = now + self.every_s
        if not self.live:
            self._say(summary_line(summary, len(self._alerts)))
            return
        if self._live is None:
            from rich.live import Live  # lazy: plain logs never need it

            # The program's stdout and stderr stay its own: no redirection.
            self._live = Live(console=self._console, auto_refresh=False, redirect_stdout=False,
                              redirect_stderr=False, transient=False)
            self._live.start()
        self._live.update(self._table(summary), refresh=True)

    def say(self, text: str) -> None:
        """One line of the watch's own (a capture taken, the watch stopped), printed at once."""
        self._say(PREFIX + text)

    def _table(self, s: StepSummary) -> Table:
        t = Table(title="lmprof watch", title_justify="left", show_header=False, show_edge=False, box=None)
        t.add_column(style="dim")
        t.add_column()
        for label, text in summary_fields(s):
            t.add_row(label, Text(text))
        if self._alerts:
            last = self._alerts[-1]
            t.add_row("alerts", Text(f"{len(self._alerts)}; last: {last.kind.replace('_', ' ')} from step "
                                     f"{last.first_step}"))
        return t

    def _say(self, line: str) -> None:
        target = self._live.console if self._live is not None else self._console
        target.print(Text(line))

    def close(self) -> None:
        """Stop redrawing (the last table stays on the terminal)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


