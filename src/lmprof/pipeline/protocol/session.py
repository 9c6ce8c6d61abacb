"""The measurement protocol's orchestrator: a state machine fed with step boundaries.

Whoever owns the loop calls :meth:`Session.boundary` after each training step, or
:meth:`~Session.generation_begin` / :meth:`~Session.forward_end` / :meth:`~Session.generation_end`
around each generation. The session counts steps, asks the plan (plan.py) where each falls, keeps
each step's time (timing.py), and tells every window (windows/) when a step begins and ends; the
driver (driver.py) says who owns the loop. :meth:`Session.finish` ends it, whatever ended the loop,
and hands back what was measured as a :class:`~lmprof.pipeline.protocol.finish.measured.Measured`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from lmprof import gc_hold
from lmprof.hardware.devices import Device
from lmprof.pipeline.protocol import messages
from lmprof.pipeline.protocol.driver import Driver, Observer
from lmprof.pipeline.protocol.ending import StopAgain, StopScript, holding_signals
from lmprof.pipeline.protocol.finish.capture import capture_run
from lmprof.pipeline.protocol.finish.measured import Described, Measured, measured
from lmprof.pipeline.protocol.folder import SessionFolder
from lmprof.pipeline.protocol.giveway import Aside, Verdict
from lmprof.pipeline.protocol.guard import failure_line, guarded, safe_name
from lmprof.pipeline.protocol.observed import ModelFacts, Observed
from lmprof.pipeline.protocol.plan import Phase, PhasePlan
from lmprof.pipeline.protocol.releases import Releases
from lmprof.pipeline.protocol.say import say
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.forwards import ForwardEnds
from lmprof.pipeline.protocol.timing import Generation, StepClock, Timings, rough_kind
from lmprof.pipeline.protocol.windows import windows_for
from lmprof.workloads.hf_interface import forward_tokens, generate_compiles
from lmprof.workloads.hooks import unwrap


class Session:
    """Counts steps and runs the measurement protocol at each boundary."""

    def __init__(self, spec: Spec, driver: Driver | None = None, clock: Callable[[], float] = time.perf_counter):
        # the command's start-up is over: nothing is measured, no user code runs, with the collector off
        gc_hold.release()
        self.observed, self.timings, self.aside = Observed(trains=spec.traits.trains), Timings(), Aside()
        self.spec, self.driver, self.clock = spec, driver or Observer(), StepClock(clock, self.observed.sync)
        self.counts = self.driver.counts(spec.counts())
        self.windows = windows_for(self)
        self.plan = self._make_plan()
        self.raises = self.driver.raises  # lmprof's own failures go on to the caller (guard.py)
        self.k = 0  # steps counted
        self._folder = SessionFolder(spec.out, spec.mode, safe_name(spec.label), spec.run_dir)
        self.folder: Path | None = None  # the run folder, once claimed
        self.measured: Measured | None = None
        self.run: Any = None  # the Run, when the driver made one
        self.message: str | None = None  # what happened, when the run ended early
        self.done = self.collected = self.failed = False  # ended; profiled window complete; lmprof failed
        self.kineto_ran = False  # lmprof started a profiler in this process (figures step or window)
        self.forked_in_window = False  # set in a child forked after lmprof's profiler ran
        self.pid = os.getpid()  # the session belongs to this process: forked children do nothing
        self.stop_again: StopAgain | None = None  # --stop-after's second chance (ending.py)
        self._finishing = self._ending = False  # finish() runs; it runs because the loop ended
        self._gen_aside: Verdict | None = None  # the user's own profiler and the running generation (giveway.py)
        self._releases = Releases()
        self.on_done = self._releases.add  # call a function once lmprof's hooks go (triggers remove theirs there)
        self._forwards: ForwardEnds | None = None  # hooks that mark a generation's forwards (forwards.py)
        self._window: tuple[Any, Any] | None = None  # a watched run's exported window, written at its completion

    # -- what the windows use (windows/base.py: Context) ------------------------------------------
    def _make_plan(self) -> PhasePlan:
        w, s, p = self.counts
        return PhasePlan.of(w, s, p, figures_at=self.driver.figures_at(w, self.observed.compiled),
                            flops_apart=self.spec.traits.trains)

    def lengthen(self, steps: int) -> None:
        self.counts = self.counts._replace(steps=self.counts.steps + steps)
        self.plan = self._make_plan()

    def claim_folder(self) -> Path:
        assert self.observed.device is not None
        self.folder = self._folder.claim(self.observed.device)
        return self.folder

    def spoil_step(self) -> None:
        self.clock.kind = None

    def window_complete(self) -> None:
        """The profiled window completed: lmprof's hooks go; in someone else's loop the run is written now (a
        script killed later keeps it), a watched run's window at this boundary's end (:meth:`_end`)."""
        self.collected = True
        watched = any(w.steps_after_window and w.active for w in self.windows)
        if not watched:
            self._releases.run()
        if self.spec.stop_after or (not watched and self.driver.writes_when_complete):
            self.finish(None)

    # -- setup -------------------------------------------------------------------------------------
    def attach(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None = None,
               compiled: bool = False, device: Device | None = None, outer: torch.nn.Module | None = None) -> None:
        """The model whose blocks are scoped, and where it runs (``device``, else its parameters' device);
        ``outer``: the module the loop calls (a compiled model's wrapper: its hooks run outside the compiled code)."""
        self.observed.attach(model, optimizers, compiled, device, outer)
        self.plan = self._make_plan()
        for w in self.windows:
            w.attached()

    @guarded
    def begin(self) -> None:
        """Mark step 1's start (``lmprof.profile``, the callbacks, lmprof's own loop)."""
        if self.spec.traits.generates:
            self.generation_begin()
        else:
            self._begin(1)

    # -- steps -------------------------------------------------------------------------------------
    def _begin(self, n: int) -> None:
        """Step ``n`` begins: the windows act, then its clock starts with a fresh mark (what lmprof did
        since the last step's end mark is in neither step)."""
        for w in self.windows:
            w.step_begins(n)
        self.clock.kind = rough_kind(n, self.plan.phase_of(n), counting=self.windows.flops.active,
                                     figures=self.windows.figures.active)
        self.clock.restart()
        for w in self.windows:
            w.clock_started(n)

    def _end(self, n: int, value: float | Generation | None) -> None:
        """Counted step ``n`` ended, its time ``value`` (None: untimed): kept by what the step was."""
        self.k = n
        if value is not None and self.plan.phase_of(n) is Phase.CLEAN:
            self.timings.keep(value, None, self.clock.wait())
        elif value is not None and self.clock.kind:  # every other step is a rough time, of its kind
            self.timings.keep(value, self.clock.kind)
        for w in self.windows:
            w.step_ends(n)
        if self._window is None and self.collected and not self.done and self.driver.writes_when_complete:
            self._window = (self.windows.profiled.export(), self.windows.compile.report())  # watched: the window's run
            self.driver.finished(self._measured(*self._window, quiet=True), watched_on=True)  # now; finish() adds the watch

    @guarded
    def boundary(self) -> None:
        """A training step ended (an optimizer step, ``prof.step()``, a Trainer step)."""
        if self.done:
            return
        if self.collected:
            for w in self.windows.more:
                if w.steps_after_window:
                    w.boundary()  # after the profiled window: only the windows that watch the steps after it
            return
        if self.spec.traits.generates:
            self.generation_end()
            if not self.done:
                self.generation_begin()
            return
        end = self.clock.mark()
        for w in self.windows:
            w.boundary()  # lmprof's own recordings in the step stop before asking whether the user's profiler runs
        tainted = False
        if not self.windows.profiled.active:
            tainted, skip, busy = self.aside.at_boundary(self.k, self.plan.warmup)
            if skip:
                self.clock.start = None if busy else self.clock.mark()  # the next step starts clean here, or untimed
                return
        start = None if tainted else self.clock.start  # a step the user's profiler ran in is never timed
        if self.k == 0 and self.plan.warmup == 0 and start is None:
            self._begin(1)  # nothing marked a start: the first boundary only marks one
            return
        self._end(self.k + 1, end - start if start is not None else None)
        if not (self.collected or self.done):
            # from the end's mark to the next step's start only lmprof's own work runs (the user's loop
            # waits in the hook): in neither step
            self._begin(self.k + 1)

    @guarded
    def generation_begin(self, model: torch.nn.Module | None = None, args: tuple[Any, ...] = (),
                         kwargs: dict[str, Any] | None = None) -> None:
        """A generation starts (``generate`` was called, ``prof.step()`` in inference, lmprof's own loop)."""
        if self.done or self.collected:
            return
        if self.observed.model is None and model is not None:
            # compiled code takes no hook: a forward compiled in place, generate()'s own compilation of the call
            inner, compiled = unwrap(model)
            self.attach(inner, compiled=compiled or generate_compiles(inner, kwargs or {}), outer=model)
        self._gen_aside = None if self.windows.profiled.active else self.aside.at_generation_begin(self.k, self.plan.warmup)
        if self._gen_aside is not None and self._gen_aside.skip:
            return
        model = self.observed.model
        if self.driver.hooks_forwards and self._forwards is None and model is not None:
            self._forwards = ForwardEnds.installed(model, self.forward_end, self.on_done, self.observed.compiled)
        self._begin(self.k + 1)
        self.clock.generation_begins(forward_tokens(args, kwargs or {})[0])  # the prompt's ids, else its embeddings

    @guarded
    def forward_end(self, output: Any = None, ids: Any = None) -> None:
        """A top-level forward of the running generation ended (a hook saw it, or lmprof's loop said so);
        ``ids``: its input, whose shape is the prompt's when it is the generation's first forward."""
        with self.windows.own_work():  # lmprof's, not the generation's
            if self.done or not self.clock.forward_ends(ids, output):
                return
            for w in self.windows:
                w.forward_end(output)

    @guarded
    def generation_end(self, output: Any = None) -> None:
        """A generation ended (``output``: what ``generate`` returned, when it did)."""
        aside, self._gen_aside = self._gen_aside, None
        if (aside is not None and aside.skip) or self.clock.gen is None or self.done or self.collected:
            return
        if self._forwards is not None:
            self._forwards.generation_ends()  # a generation that learned where .forward() calls end: its last
        value, self.observed.input_shape = self.clock.generation_ends(self.observed.input_shape, output)
        for w in self.windows:
            w.boundary()
        if value is None:
            self.observed.generations_without_forward += 1
        elif not self.windows.profiled.active and self.aside.at_generation_end(aside is not None and aside.tainted):
            value = None  # the user's own profiler ran in it: never timed
        self._end(self.k + 1, value)

    # -- the end -----------------------------------------------------------------------------------
    @guarded
    @holding_signals
    def finish(self, reason: str | None) -> Measured | None:
        """End the session: stop what runs, collect what was measured, say what happened.

        ``reason`` is None when the window completed, else what ended the loop early ("the script
        exited (code 0)", ...). Returns what was measured (None: nothing); the driver has done with it
        what it does (``lmprof run`` and the like: the run written, :attr:`run`)."""
        if self.done or self._finishing:
            return self.measured
        self._finishing, self._ending = True, reason is not None  # not done until written: a failure goes to fail()
        reason = None if self.collected else reason  # the window completed: a whole run, whatever ended the loop
        unit, seen = self.spec.unit, self.observed
        here = messages.where(self.plan, self.k, self.timings.clean, self.windows.profiled.complete, unit)
        try:
            for w in self.windows.more:
                w.stop()  # the run's end is theirs too (the whole-run watch): what they measured is kept
            profile, compiled = self._window or (self.windows.profiled.export(), self.windows.compile.report())
        finally:
            self._teardown()
        seen.notes.extend(filter(None, (self.aside.note(unit),
                                        None if self.timings.clean else self.timings.fall_back(unit, self.plan))))
        if not self.timings.clean:
            self.message = messages.nothing_measured(reason or "the session ended", self.plan, self.k,
                                                     self.timings.clean, unit, infer=self.spec.traits.generates,
                                                     seen=seen, aside=self.aside)
            self._folder.settle(None)  # nothing measured: a trace of a window that never completed goes with the folder
            self.done = True
            return None
        self.measured = self._measured(profile, compiled)
        self.run = self.driver.finished(self.measured)
        self._folder.settle("lmprof stopped while writing it")
        self.done = True
        if reason is not None:
            self.message = messages.wrote(reason, here, bool(self.timings.first_call), self.folder)
        elif self.spec.stop_after:
            self.stop_again = StopAgain.after_writing(self.folder)
            raise StopScript()
        return self.measured

    def _measured(self, profile: Any, compiled: Any, quiet: bool = False) -> Measured:
        """What was measured, into the claimed folder (``quiet``: no summary; the run is written again later)."""
        spec = dataclasses.replace(self.spec, verbose=False) if quiet else self.spec
        return measured(spec, self.plan, self.claim_folder(), self.observed, self.timings, profile, compiled,
                        self.windows, self.describe)

    def assemble_capture(self, folder: Path, profile: Any, step_s: list[float], config: dict[str, Any],
                         per_step: tuple[float | None, float | None, float | None, float | None]) -> Any:
        return capture_run(self.spec, self.plan, self.observed, folder, profile, step_s, config, per_step,
                           self.describe)

    def describe(self, facts: ModelFacts) -> Described:
        """The driver's description of the workload (the finish's figures need it)."""
        return self.driver.describe(self.spec, self.counts, facts, self.observed)

    def _teardown(self) -> None:
        """Stop every window, keeping nothing it held, and remove every hook; each part runs if another fails."""
        for w in self.windows:
            with contextlib.suppress(Exception):
                w.abort()
        self._releases.run()

    def abandon(self) -> None:
        """lmprof's own loop failed: stop and remove everything; the caller raises the error on."""
        self.failed = self.done = True
        self._teardown()

    def fail(self, exc: BaseException) -> None:
        """lmprof failed inside the user's program: end the session, keep what was written (every
        file is written atomically, so what is there is whole), and say so in one line."""
        self.abandon()
        self.message = None
        line = failure_line(exc, writing=isinstance(exc, OSError) or self._finishing, continues=not self._ending)
        self._folder.settle(line.removeprefix("lmprof: "))
        say(line)
