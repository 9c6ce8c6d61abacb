"""The sweep's terminal progress: a rich bar with the current point, done/failed counts and time left.

Each finished point is also printed as one line above the bar, so piped output (CI logs) keeps a
record even where no bar is drawn.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from lmprof.sweep.runner import Outcome, SweepSummary
from lmprof.sweep.spec import AnyPoint

_STYLE = {"ok": "green", "oom": "magenta", "timeout": "yellow", "error": "red"}


def duration(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``1h02m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class ConsoleProgress:
    """A :class:`~lmprof.sweep.runner.SweepListener` drawing on a rich console."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[current]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=console,
            transient=True,
        )
        self.task: TaskID | None = None  # the bar, once begin() adds it
        self.live = False
        self.done = 0
        self.failed = 0
        self.todo = 0
        self.times: list[float] = []
        self.t_point = 0.0

    def _left(self) -> str:
        # Mean time of the points run so far times the points left: steadier than rich's speed estimate.
        remaining = self.todo - self.done - self.failed
        if not self.times or remaining <= 0:
            return "time left: ?" if remaining > 0 else ""
        return f"~{duration(sum(self.times) / len(self.times) * remaining)} left"

    def _update(self, current: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.done + self.failed, current=escape(current),
                                 counts=f"done {self.done}, failed {self.failed}", left=self._left())

    def begin(self, total: int, todo: int, skipped_ok: int) -> None:
        """Start the bar."""
        self.todo = todo
        if skipped_ok:
            self.console.print(f"resume: {skipped_ok} of {total} points already ok (not run again), {todo} to run")
        self.live = self.console.is_terminal  # piped output gets the per-point lines only
        if self.live:
            self.progress.start()
        self.task = self.progress.add_task("sweep", total=max(todo, 1), current="starting", counts="", left="")
        self._update("starting")

    def point_started(self, point: AnyPoint, index: int) -> None:
        """Show the point now running."""
        self.t_point = time.monotonic()
        self._update(point.label)

    def point_finished(self, point: AnyPoint, outcome: Outcome, headline: str) -> None:
        """Print the point's line and advance the bar."""
        self.times.append(time.monotonic() - self.t_point)
        if outcome.status == "ok":
            self.done += 1
        else:
            self.failed += 1
        style = _STYLE.get(outcome.status, "white")
        detail = headline if outcome.status == "ok" else (outcome.message or "")
        self.progress.console.print(
            f"[{style}]{outcome.status:<7}[/] {escape(point.id)}  {escape(f'{point.label:<44}')} "
            f"{duration(outcome.duration_s):>7}  {escape(detail)}",
            markup=True, highlight=False, soft_wrap=True,
        )
        self._update("")

    def end(self, summary: SweepSummary) -> None:
        """Remove the bar."""
        if self.live:  # rich prints a newline on stop() even for a bar it never drew
            self.progress.stop()
