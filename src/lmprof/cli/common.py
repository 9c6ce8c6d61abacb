"""Helpers shared by verb modules: merging YAML with flags, the console, interruptions."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import typer
from rich.console import Console

# Piped output (CI logs, files) gets a fixed width instead of rich's 80-column fallback; plain lines
# are never hard-wrapped (a path or a message split mid-phrase breaks grep), tables still fit.
_probe = Console()
# markup=False: names and paths are the user's (a folder 'runs[v2]', a model 'm[/]') and must print as
# they are; the few styled lines ask for markup=True and escape what they interpolate.
console = Console(highlight=False, markup=False, width=None if _probe.is_terminal else 120, soft_wrap=True)


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM; the message says what was kept. ``code`` is the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def interruptible(unfinished: str = "the run did not finish (no run.json was written)") -> Iterator[None]:
    """SIGTERM acts as Ctrl-C while the block runs, so temporary files are cleaned up the same way;
    an interruption comes out as :class:`Interrupted` (exit 130 for Ctrl-C, 143 for SIGTERM), saying
    ``unfinished`` where no run folder was involved."""
    got: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        yield
    except KeyboardInterrupt as exc:
        folder, kept = getattr(exc, "folder", None), getattr(exc, "kept", [])
        what = "terminated (SIGTERM)" if got else "interrupted"
        if folder is not None:
            message = (f"{what}: kept {folder}, marked incomplete (file INCOMPLETE; it holds {', '.join(kept)}; "
                       "no run.json was written)")
        elif hasattr(exc, "folder"):  # the run knew its folder and found nothing measured in it
            message = f"{what} before anything was measured: nothing kept"
        else:
            message = f"{what}: {unfinished}"
        raise Interrupted(message, 143 if got else 130) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s} s" if s < 90 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


class _Status:
    """What a long command shows while it works: its stage, step i/N and an ETA (the mean time of the
    stage's items so far times those left), on the live status line of a terminal or as plain lines on
    stderr (a log). In a log, work shorter than ``quiet_s`` prints nothing (a quick run, or one refused
    or interrupted at once, keeps its one line); after that, a line at each stage and at most one each
    ``every_s`` seconds within one."""

    def __init__(self, what: str, live: Any, every_s: float, quiet_s: float = 5.0):
        self.what, self.live, self.every_s, self.quiet_s = what, live, every_s, quiet_s
        self.stage: str | None = None
        self.t0 = self.t_stage = self.t_prev = time.monotonic()
        self.t_line: float | None = None

    def __call__(self, event: Any) -> None:
        now = time.monotonic()
        new_stage = event.stage != self.stage
        if new_stage:  # the stage's first item began when the previous report came
            self.stage, self.t_stage = event.stage, self.t_prev
        self.t_prev = now
        text = f"{self.what}: {event.stage}"
        if event.done is not None and event.total:
            text += f" {event.done}/{event.total}"
            left = event.total - event.done
            if left > 0 and event.done > 0:
                text += f", ~{_eta((now - self.t_stage) / event.done * left)} left"
        if self.live is not None:
            self.live.update(text + "...")
            return
        if now - self.t0 < self.quiet_s:
            return
        if self.t_line is None or new_stage or now - self.t_line >= self.every_s or event.done == event.total:
            self.t_line = now
            print(f"lmprof: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_status(what: str, every_s: float = 10.0) -> Iterator[None]:
    """Show ``what`` and how far it has come (:mod:`lmprof.progress`) while the block runs: a live status
    line on a terminal, plain lines on stderr otherwise, so a CI log is never silent for minutes.
    ``LMPROF_PROGRESS=0`` keeps the plain lines out (the spinner stays)."""
    from lmprof import progress

    if os.environ.get("LMPROF_PROGRESS", "").strip() == "0" and not console.is_terminal:
        yield
    elif console.is_terminal:
        with console.status(f"{what}...") as live, progress.listening(_Status(what, live, every_s)):
            yield
    else:  # no opening line: a refusal before the first step stays the one line it is
        with progress.listening(_Status(what, None, every_s)):
            yield


def log_to_trackers(folder: Path, trackers: list[str]) -> None:
    """``--log-to``: export the written run folder to each tracker."""
    if trackers:
        from lmprof.trackers.export import log_to

        for line in log_to(folder, trackers):
            console.print(line, markup=False)


def write_report(run: Any, folder: Path, enabled: bool = True) -> None:
    """Write report.html into the run folder and print where it is."""
    if not enabled:
        return
    from lmprof.show.report import report_line, write_run_report

    console.print(report_line(write_run_report(run, folder)), markup=False)


# -- flags lmprof train and infer share whose help differs around them (the rest: cli/measuring.py) ----------
DEVICE = typer.Option(None, help="auto, cpu, cuda, cuda:N or mps [default: auto]")
COMPILE_MODE = typer.Option(None, "--compile-mode", help="default, reduce-overhead or max-autotune [default: default]")


def show_run(run: Any, folder: Path, report: bool, trackers: list[str]) -> None:
    """A written run: its summary, report.html, and its export to the trackers asked for."""
    from lmprof.show.summary import render

    render(run, console, folder=str(folder))
    write_report(run, folder, report)
    log_to_trackers(folder, trackers)
