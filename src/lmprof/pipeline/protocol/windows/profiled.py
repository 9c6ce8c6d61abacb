"""The profiled window: torch.profiler over one warm-up step and the profiled steps, with the probes
that scope someone else's step (pipeline/protocol/probes.py).

It starts as the profiler's warm-up step begins; each profiled step is a ``ProfilerStep#n`` range
opened and closed at its boundaries. When the last one ends only the profiler's stop happens inside
the user's call (:meth:`ProfiledWindow.collect`); its trace is written at the run's end
(:meth:`ProfiledWindow.export`). A user's own profiler starting while it runs stops it first: the
window is dropped, unwritten, and the run keeps its clean figures.
"""
from __future__ import annotations

import threading
from typing import Any

from lmprof.measure.profiling import ProfiledPhase
from lmprof.measure.window import GiveWay, ProfilerWindow
from lmprof.pipeline.protocol.guard import run_guarded, why
from lmprof.pipeline.protocol.plan import Phase
from lmprof.pipeline.protocol.probes import Probes
from lmprof.pipeline.protocol.windows.base import Context, Window, beside_of


class ProfiledWindow(Window):
    """The profiler and its probes, stepped by the plan."""

    name = "profiled"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.window: ProfilerWindow | None = None
        self.stopped: ProfilerWindow | None = None  # the completed window, stopped, its trace not yet written
        self._probes: Probes | None = None
        self._give_way: GiveWay | None = None
        self.off_thread = False  # the window's first step ran outside the main thread: no window
        # the threads the steps so far began in (the objects: a new thread may take an ended one's ident)
        self._threads: set[threading.Thread] = set()

    @property
    def active(self) -> bool:
        return self.window is not None

    @property
    def complete(self) -> int:
        """Profiled steps completed so far."""
        window = self.window or self.stopped
        return window.complete if window is not None else 0

    def start(self) -> None:
        ctx, seen = self.ctx, self.ctx.observed
        folder = ctx.claim_folder()
        assert seen.device is not None
        self.window = ProfilerWindow(seen.device.torch_device, folder / "trace.json.gz")
        self._probes = Probes(seen.model, ctx.spec.mode, blocks=not seen.compiled,
                              phases=ctx.driver.probes_place_phases,
                              beside=beside_of(ctx))
        self._probes.install(seen.optimizers)
        ctx.kineto_ran = True
        self.window.start()
        self._give_way = GiveWay(lambda: run_guarded(ctx, self._user_profiler_starts))
        self._give_way.install()

    def step_begins(self, step: int) -> None:
        self._threads.add(threading.current_thread())
        if not self.ctx.plan.window_starts(step):
            return
        if threading.current_thread() is not threading.main_thread() and len(self._threads) > 1:
            # torch's profiler must stop in the thread that started it, and the window spans several steps:
            # a generate() per thread (a streamer's) would stop it from another, which kills the process. A
            # loop whose every step so far ran in this one thread (training in a worker thread) keeps to it.
            if not self.off_thread:
                self.off_thread = True
                self.ctx.observed.notes.append(
                    f"no profiled window: {self.ctx.spec.unit} {step}, where it starts, ran outside the main thread "
                    f"and the {self.ctx.spec.unit}s before it in {len(self._threads) - 1} other(s) (a streamer's "
                    "generate() in a thread of its own?), and torch's profiler must stop in the thread that started "
                    "it; the clean timings and the figures stand")
            return
        self.start()

    def clock_started(self, step: int) -> None:
        if self.window is not None and self.ctx.plan.phase_of(step) is Phase.PROFILED:
            self.window.open_step()
        if self._probes is not None and self._probes.active and not self._probes.trains:
            self._probes.generation_begin()

    def boundary(self) -> None:
        # The step's range ends at once, as its clock did: lmprof's own work at the boundary (the
        # windows, the bookkeeping) is neither in the step's time nor in its range, where it would
        # read as the user's loop ('other').
        if self._probes is not None and self._probes.active:
            self._probes.scopes.close_all()  # inside the step's range: none may outlast it
        if self.window is not None:
            self.window.close_step()

    def step_ends(self, step: int) -> None:
        phase = self.ctx.plan.phase_of(step)
        if self._probes is not None and self._probes.active:
            self._probes.step_end()
            if phase is Phase.PROFILER_WARMUP:  # the profiler's warm-up step ended: count from here
                self._probes.reset_counts()
        if self.window is not None and phase is Phase.PROFILED:
            self.window.close_step()
            if self.ctx.plan.window_completes(step):
                self.collect()

    def forward_end(self, output: Any) -> None:
        if self._probes is not None and self._probes.active:
            self._probes.forward_end()

    def probes(self) -> Probes | None:
        return self._probes

    def collect(self) -> None:
        """The window completed: stop the profiler (the trace's export waits for the run's end, outside
        the user's step) and remove every probe."""
        assert self.window is not None
        self.window.stop()
        self.stopped = self.window
        self._release()  # while the window is known: its step count divides what the probes saw
        self.window = None
        self.ctx.window_complete()

    def export(self) -> ProfiledPhase | None:
        """The window stopped and its trace written (None when it never started); when the place is full
        or read-only, the run keeps its clean figures (run.json is small and may still fit) and says why
        it has no operators or blocks."""
        window = self.stopped or self.window
        if window is None:
            return None
        window.stop()  # nothing more when collect() stopped it already
        try:
            return window.export()
        except OSError as exc:
            self.ctx.observed.notes.append(f"the profiled window's trace could not be written ({why(exc)}): clean "
                                           "timings only, no operators or block breakdown")
            return None

    def abort(self) -> None:
        if self.window is not None:
            self.window.abort()  # nothing of a running window is kept (a stopped one is left as it is)
        self._release()
        self.window = None

    def _release(self) -> None:
        """The probes removed, what they saw per profiled step kept; read once (a second call does nothing)."""
        if self._give_way is not None:
            self._give_way.remove()
            self._give_way = None
        probes, self._probes = self._probes, None
        if probes is None:
            return
        seen, per = self.ctx.observed, max(self.complete, 1)
        seen.counted(probes, per)
        seen.input_shape = seen.input_shape or probes.input_shape
        probes.remove()

    def _user_profiler_starts(self) -> None:
        """The user's own profiler is starting while this window runs: lmprof's stops first, unwritten,
        and the run keeps the clean figures."""
        if self.window is not None:
            self.window.abort()
            self.window = None
        self.ctx.observed.notes.append("your own torch.profiler started during lmprof's profiled window: lmprof "
                                       "stopped its profiler (two cannot run at once) and kept the clean timings only")
        self.ctx.finish("your own torch.profiler started")
