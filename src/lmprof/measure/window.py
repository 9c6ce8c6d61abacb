"""A profiled window driven from outside: someone else's loop says when each step starts and ends.

:func:`lmprof.measure.profiling.profile_steps` owns its loop; here the user's code does, so the
window is opened, stepped and closed by calls. Each profiled step gets a ``ProfilerStep#<n>`` range
(the name attribution looks for), opened and closed explicitly, so gaps between steps (e.g. a
script's own work between two ``generate`` calls) stay outside every step. The profiler's own
warm-up is a step run under the profiler with no range: its events are in the trace but belong to
no step, and the operator table leaves them out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.profiler import profile

from lmprof.atomic import atomic_path
from lmprof.measure.native_logs import native_logs_dropped
from lmprof.measure.profiling import ProfiledPhase, _activities, export_trace
from lmprof.patch import Patch

STEP_PREFIX = "ProfilerStep#"


# Looked up once: the whole-run watch asks at every step of the user's loop.
_PROFILER_ENABLED: Callable[[], bool] | None = getattr(torch._C._autograd, "_profiler_enabled", None)  # noqa: SLF001


def user_profiler_active() -> bool:
    """Whether a torch profiler (torch.profiler, torch.autograd.profiler, emit_nvtx) is running in
    this process. torch has no public call for it: its Python flag, and the C++ state its own
    record_function consults (no public equivalent)."""
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
        return True
    return _PROFILER_ENABLED is not None and bool(_PROFILER_ENABLED())


class GiveWay:
    """While installed, any other profiler about to start first calls ``on_other`` (which stops
    lmprof's window): two profilers at once is an error in torch, or a crash in kineto.

    Both torch.profiler.profile and torch.autograd.profiler.profile prepare a trace through
    ``torch.autograd.profiler.profile._prepare_trace``; that is the one place patched.
    """

    def __init__(self, on_other: Callable[[], None]):
        self.on_other = on_other

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def _prepare_trace(prof: Any) -> Any:
                on_other()
                return original(prof)

            return _prepare_trace

        self._patch = Patch(torch.autograd.profiler.profile, "_prepare_trace", wrap)

    def install(self) -> None:
        self._patch.install()  # remove() restores torch's own

    def remove(self) -> None:
        self._patch.remove()


class ProfilerWindow:
    """torch.profiler started, stepped and stopped by calls from the caller's loop."""

    def __init__(self, device: torch.device, trace_path: Path):
        self.device = device
        self.trace_path = trace_path
        self._prof: profile | None = None
        self._step: Any = None  # the open ProfilerStep record_function
        self.complete = 0  # steps whose range was closed by close_step()
        self.partial = False  # a step was open when the window stopped
        self._running = False

    def start(self) -> None:
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        self._prof = profile(activities=_activities(self.device))
        with native_logs_dropped():  # kineto's profiler_start line is not the user's to see
            self._prof.start()
        self._running = True

    @property
    def running(self) -> bool:
        """Whether the profiler is on."""
        return self._running

    def abort(self) -> None:
        """Stop profiling and write nothing (lmprof failed, or gave way to the user's own profiler)."""
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        if self._prof is not None and self._running:
            self._running = False
            with native_logs_dropped():
                self._prof.stop()

    def open_step(self) -> None:
        """Begin the range of the next profiled step."""
        self._step = torch.profiler.record_function(f"{STEP_PREFIX}{self.complete + 1}")
        self._step.__enter__()

    def close_step(self) -> None:
        """End the open step's range (the caller synchronized the device first)."""
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
            self.complete += 1

    def stop(self) -> None:
        """Stop profiling. A step still open is closed, flagged ``partial`` and left out of the
        operator table; :func:`drop_partial` removes it from the loaded trace. Only this happens
        inside the user's step: the events stay in memory until :meth:`export`."""
        assert self._prof is not None, "window was never started"
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
            self.partial = True
        if self._running:
            with native_logs_dropped():
                self._prof.stop()
        self._running = False

    def export(self) -> ProfiledPhase:
        """Write the stopped window's trace (plain JSON; :func:`compress` makes the .gz later).

        Called when the run is assembled (the script, the with-block or the training ended), not in
        the step that ended the window: torch's export of a few hundred thousand events takes
        seconds the user's call would otherwise pay."""
        assert self._prof is not None and not self._running, "export() needs a stopped window"
        raw = self.raw_path
        # Atomic like every other file: a full disk or a kill mid-export leaves no truncated trace.
        export_trace(self._prof, raw)
        # The operator table is made later from this file (measure.profiling.op_table): torch's own
        # event parsing would cost seconds.
        return ProfiledPhase(trace_path=raw, ops=[], steps=self.complete)

    @property
    def raw_path(self) -> Path:
        """Where :meth:`stop` writes the trace uncompressed (``trace.json`` for ``trace.json.gz``)."""
        return self.trace_path.with_suffix("") if self.trace_path.suffix == ".gz" else self.trace_path


def compress(phase: ProfiledPhase, gz_path: Path) -> None:
    """Gzip a window's plain trace into ``gz_path`` (atomically) and drop the plain one."""
    if phase.trace_path == gz_path or not phase.trace_path.is_file():
        return
    import gzip
    import shutil

    with atomic_path(gz_path) as tmp, open(phase.trace_path, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    phase.trace_path.unlink()
    phase.trace_path = gz_path


def drop_partial(table: Any, complete: int) -> None:
    """Remove ProfilerStep ranges numbered above ``complete`` from a loaded trace table, in place."""
    ev = table.event_cols

    def late(name: str) -> bool:
        number = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
        return number.isdigit() and int(number) > complete

    # Judged once per distinct name; the appended False is what a missing name (code -1) reads.
    by_code = np.array([late(str(n)) for n in ev.labels("name")] + [False], dtype=bool)
    drop = by_code[ev["name"]]
    if drop.any():
        table.keep_events(~drop)
