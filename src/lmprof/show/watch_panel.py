"""The whole-run watch on stderr: step, tokens/s, loss, memory, input wait and the alerts, as plain lines.

One line every ``every_s`` (30 s), on a terminal as in a log file, a pipe or a batch job's stderr; a new
alert is one line of its own at once. Never a live region redrawn in place: the program prints to the same
terminal, and a redraw moves the cursor up over what it printed meanwhile (the HF Trainer's log lines were
erased, or the table drawn into them). The lines go beside the program's progress bars (show/console.py).
Everything from a record is printed as text (rich markup off). Fed by the recorder's summaries; it computes
no figure.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Sequence, TextIO

from rich.text import Text

from lmprof.record.run import WatchAlert
from lmprof.record.watch import StepSummary
from lmprof.show.console import beside_bars, console_on
from lmprof.show.format import human_bytes, number

PREFIX = "lmprof watch: "
EVERY_S = 30.0  # the latest step's line at most this often: about 120 lines in an hour of training


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
    """Shows the latest step and the alerts as plain lines; ``update`` is cheap when nothing is due."""

    def __init__(self, stream: TextIO | None = None, *, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.clock = clock
        self._next = float("-inf")
        self._alerts: list[WatchAlert] = []
        self._console = console_on(self.stream, width=160, highlight=False, markup=False, emoji=False, soft_wrap=True)

    def update(self, summary: StepSummary | None, new_alerts: Sequence[WatchAlert] = ()) -> None:
        """The latest step (None: nothing new) and the alerts raised since the last update."""
        for a in new_alerts:
            self._alerts.append(a)
            self._say(alert_line(a))
        now = self.clock()
        if summary is None or now < self._next:
            return
        self._next = now + self.every_s
        self._say(summary_line(summary, len(self._alerts)))

    def say(self, text: str) -> None:
        """One line of the watch's own (a capture taken, the watch stopped), printed at once."""
        self._say(PREFIX + text)

    def _say(self, line: str) -> None:
        with beside_bars(self.stream):
            self._console.print(Text(line))
