"""The figures step: the warm-up step (or generation) that gives a run its memory and, where lmprof has
no formulas for the model, its FLOP figures.

It runs with the allocator's events recorded, the phases scoped, and, for a model lmprof cannot
describe, torch's FlopCounterMode on. Its time is a rough one (kind ``figures``); nothing here reads
a clock. Its results are kept raw; turning them into figures waits until the user's call has
returned (:meth:`FiguresStep.result`). When the script ends before lmprof's profiled window, the
step's recording is the run's profile (:meth:`FiguresWindow.profile`). It gives way to the user's
own profiler: not started under it, stopped (keeping nothing) when it starts inside the step.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmprof.hardware.devices import Device
from lmprof.measure.flops import StepFlops
from lmprof.measure.held import HeldOutputs
from lmprof.measure.memory import MeasuredMemory, MemoryWindow
from lmprof.measure.other_models import Beside, OtherModel, OtherModels
from lmprof.measure.profiling import ProfiledPhase
from lmprof.measure.tensor_bytes import ranges_bytes, record_grads, static_memory
from lmprof.measure.window import STEP_PREFIX, GiveWay, user_profiler_active
from lmprof.pipeline.protocol.guard import run_guarded, why
from lmprof.pipeline.protocol.probes import Probes
from lmprof.workloads.stepping import optimizers_stepping
from lmprof.pipeline.protocol.windows.base import Context, Window, beside_of
from lmprof.workloads.hf_interface import cache_bytes, returned_cache
from lmprof.workloads.hooks import takes_hooks


@dataclass
class StepFigures:
    """What the figures step measured."""

    memory: MeasuredMemory | None
    flops: int | None  # the whole step (training) or generation (inference)
    prefill_flops: int | None  # inference: up to the end of the first forward
    cache_bytes: int | None  # inference: the KV cache the last forward returned
    flops_aside: int = 0  # training: FLOPs of the model's forwards without grad, left out of ``flops``


class FiguresStep:
    """Memory (always) and FLOPs (``count_flops``) of one step driven by someone else's loop."""

    def __init__(self, model: torch.nn.Module | None, optimizers: list[torch.optim.Optimizer], device: Device,
                 mode: str, *, count_flops: bool, compiled: bool, phases: bool = True,
                 snapshot_dir: Path | None = None, beside: Beside | None = None):
        self.model, self.optimizers, self.device = model, optimizers, device
        # other models the step runs (None: not looked for, driver.py: Driver.other_models)
        self.beside = beside
        self.compiled = compiled
        self.snapshot_dir = snapshot_dir  # CUDA: the allocator's history of the step, memory_snapshot.pickle there
        self.probes = Probes(model, mode, blocks=not compiled, phases=phases, beside=beside)
        # a training step's evaluations (the model without grad) are counted apart
        self.flops = StepFlops(model if self.probes.trains and not compiled else None) if count_flops else None
        self._stack = contextlib.ExitStack()
        self._grads: dict[int, Any] | None = None
        self._held: HeldOutputs | None = None  # training: what the loop keeps alive into backward
        self._others: OtherModels | None = None  # other models the step runs (a teacher, a reference, an assistant)
        self._memory: MemoryWindow | None = None
        self._stopped = False
        self._range: Any = None  # the step's ProfilerStep range while it runs
        self._result: StepFigures | None = None
        self._static_after: Any = None
        self.memory_error: str | None = None  # why the step's memory could not be read, when it could not
        self.cache_bytes: int | None = None
        self.active = False

    @property
    def recomputes(self) -> bool | None:
        """Whether the step's backward recomputed checkpointed activations (None: not seen)."""
        return self._held.recomputes if self._held is not None else None

    @property
    def others(self) -> list[OtherModel] | None:
        """Other models the step ran forwards of (None: not watched)."""
        return self._others.others if self._others is not None else None

    def start(self) -> None:
        """Begin recording (the step starts now)."""
        model = self.model
        opts = list(self.optimizers)
        if model is not None:
            self._memory = MemoryWindow(self.device, lambda: static_memory(model, opts), out_dir=self.snapshot_dir,
                                        snapshot=self.snapshot_dir is not None)
            hooked = not self.compiled and takes_hooks(model)  # a hook in a compiled model would recompile it
            if self.probes.trains:
                self._grads = self._stack.enter_context(record_grads(model, opts))
                if hooked:
                    self._held = self._stack.enter_context(HeldOutputs(model).watching())
            if self.beside is not None:  # hooks on the other models, not on the model: it may be compiled
                self._others = self._stack.enter_context(OtherModels(self.beside).watching())
        self.probes.install(self.optimizers)
        self.active = True
        if self._memory is not None:
            self._memory.start()
            # One step range, so that the recording can stand in for the profiled window when the
            # script ends before that window completes (one generate(), three training steps).
            self._range = torch.profiler.record_function(f"{STEP_PREFIX}1")
            self._range.__enter__()
            if not self.probes.trains:
                self.probes.generation_begin()
        if self.flops is not None:
            self.flops.start()

    def forward_end(self, output: Any) -> None:
        """A top-level forward of a generation ended: prefill's FLOPs, and the cache it returned."""
        if not self.active:
            return
        if self.flops is not None and not self.flops.marks:
            self.flops.mark()
        self.probes.forward_end()
        # model.forward(x): the outputs of its outermost submodule calls (forwards.py), one of which may hold it
        found = next(filter(None, map(returned_cache, output if isinstance(output, tuple) else (output,))), None)
        if found is not None:
            with contextlib.suppress(Exception):  # a cache lmprof cannot read is a missing figure, not a failure
                self.cache_bytes = cache_bytes(found[1])

    def stop(self) -> None:
        """End the step (the device is synchronized first); results wait for :meth:`result`."""
        if not self.active:
            return
        self.active = False
        try:
            if self.flops is not None:
                self.flops.stop()
            self._close_range()
            if self._memory is not None:
                self._memory.stop()
                self._stopped = True
                if self.model is not None:  # the optimizer's state exists once a step ran (a first call made it)
                    self._static_after = static_memory(self.model, self.optimizers)
        finally:
            self.probes.remove()
            self._stack.close()

    def _close_range(self) -> None:
        self.probes.step_end()
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def export_trace(self, path: Path) -> bool:
        """Write the step's recording as a one-step trace at ``path`` (the profile of a script too
        short for lmprof's profiled window); False when the step did not complete."""
        return self._stopped and self._memory is not None and self._memory.export_trace(path)

    def abort(self) -> None:
        """Stop everything and keep nothing (lmprof failed, or the user's own profiler starts)."""
        self.active = False
        with contextlib.suppress(Exception):
            self._close_range()
        if self.flops is not None:
            with contextlib.suppress(Exception):
                self.flops.stop()
        if self._memory is not None:
            with contextlib.suppress(Exception):
                self._memory.abort()
        with contextlib.suppress(Exception):
            self.probes.remove()
        with contextlib.suppress(Exception):
            self._stack.close()
        self._memory, self.flops = None, None

    def result(self) -> StepFigures:
        """The figures, made now (after the user's call returned); made once, then kept."""
        if self._result is None:
            self._result = self._make_result()
        return self._result

    def _make_result(self) -> StepFigures:
        mem = None
        if self._memory is not None and self._stopped:
            try:
                mem = self._memory.result()
            except OSError as exc:  # its recording could not be written (a full disk): a missing figure
                self.memory_error = why(exc)
        if mem is not None and self._static_after is not None:
            mem.static = self._static_after
        if mem is not None and self._grads:
            mem.grads = ranges_bytes(r for ranges in self._grads.values() for r in ranges)
        if mem is not None and self._held is not None:
            mem.held = self._held.held
        total = self.flops.stop() if self.flops is not None else None
        prefill = self.flops.marks[0] if self.flops is not None and self.flops.marks else None
        return StepFigures(memory=mem, flops=total or None, prefill_flops=prefill, cache_bytes=self.cache_bytes,
                           flops_aside=self.flops.aside if self.flops is not None else 0)


class FiguresWindow(Window):
    """Starts the figures step when its step begins, stops it when any step ends."""

    name = "figures"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.step: FiguresStep | None = None
        self.gave_way = False  # the user's own profiler kept the step from being taken (a note says so)
        self._give_way: GiveWay | None = None

    @property
    def active(self) -> bool:
        return self.step is not None and self.step.active

    def step_begins(self, step: int) -> None:
        ctx = self.ctx
        if step != ctx.plan.figures_at or self.step is not None or ctx.observed.model is None:
            return
        if user_profiler_active():
            self.gave_way = True
            what = "measurement" if ctx.plan.flops_apart else "or FLOP count"
            ctx.observed.notes.append(f"your own torch.profiler ran during the figures step (a warm-up step): no memory "
                                      f"{what} was taken (lmprof never runs a profiler inside yours)")
            return
        self.start()

    def start(self) -> None:
        ctx, seen = self.ctx, self.ctx.observed
        assert seen.device is not None
        if ctx.spec.traits.trains and not seen.optimizers and seen.model is not None:
            self._find_optimizers()
        describe = seen.shape() is None and not seen.compiled and not ctx.plan.flops_apart
        # On CUDA the step's allocation history goes into the run folder (memory_snapshot.pickle).
        snapshot_dir = ctx.claim_folder() if seen.device.kind == "cuda" else None
        self.step = FiguresStep(seen.model, seen.optimizers, seen.device, ctx.spec.mode, count_flops=describe,
                                compiled=seen.compiled, phases=ctx.driver.probes_place_phases,
                                snapshot_dir=snapshot_dir,
                                beside=beside_of(ctx))
        ctx.kineto_ran = True
        self.step.start()
        self._give_way = GiveWay(lambda: run_guarded(ctx, self._user_profiler_starts))  # after lmprof's own started
        self._give_way.install()

    def _find_optimizers(self) -> None:
        """No optimizer step was seen (a loop that compiles its optimizer step runs no hooks: triggers.py): the
        optimizers holding the model's parameters, found among live objects, so their state is measured."""
        seen = self.ctx.observed
        assert seen.model is not None
        found = optimizers_stepping(seen.model)
        if found:
            seen.optimizers.extend(found)
            seen.notes.append(f"no optimizer step was seen (an optimizer step compiled with torch.compile runs no hooks): "
                              f"the optimizer(s) holding the model's parameters ({', '.join(type(o).__name__ for o in found)}) "
                              "were found among live objects, their state is in memory.optimizer, and their step "
                              "time is in 'other (step)'")

    def boundary(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self.step is not None and self.step.active:
            self.ctx.observed.sync()
            self.step.stop()
            if self.step.recomputes is not None:  # the FLOPs step after it counts what the recomputation adds
                self.ctx.observed.recomputes = self.step.recomputes
            if self.step.others is not None:  # ... and what other models' forwards add
                self.ctx.observed.others = self.step.others
        self._remove_give_way()

    def abort(self) -> None:
        if self.step is not None and self.step.active:
            self.step.abort()
            self.step = None
        self._remove_give_way()

    def forward_end(self, output: Any) -> None:
        if self.step is not None and self.step.active:
            self.step.forward_end(output)

    def probes(self) -> Probes | None:
        return self.step.probes if self.step is not None and self.step.active else None

    def _remove_give_way(self) -> None:
        if self._give_way is not None:
            self._give_way.remove()
            self._give_way = None

    def _user_profiler_starts(self) -> None:
        """The user's profiler starts inside the figures step: lmprof's stops first, keeping nothing."""
        counting = self.step is not None and self.step.flops is not None
        self.gave_way = True
        self.abort()
        self.ctx.observed.notes.append("your own torch.profiler started during the figures step (a warm-up step): lmprof "
                                       "stopped its memory recording (two profilers cannot run at once): no memory "
                                       f"{'or FLOP count' if counting else 'measurement'}")
        self.ctx.spoil_step()

    def result(self) -> StepFigures | None:
        """What the step measured (made now, after the user's call returned), None when it did not run."""
        return self.step.result() if self.step is not None else None

    def profile(self, folder: Path, unit: str) -> ProfiledPhase | None:
        """The step's recording as the run's profile, when no profiled step completed."""
        fs = self.step
        if fs is None:
            return None
        path = folder / "trace.json"
        notes = self.ctx.observed.notes
        try:
            if not fs.export_trace(path):
                return None
            fs.result()  # reads the exported file, before the run's assembly compresses it
        except Exception as exc:  # noqa: BLE001 - a missing profile is a missing figure, never a failure
            notes.append(f"the figures step's trace could not be written ({type(exc).__name__}: {exc})")
            return None
        flops = " with FlopCounterMode on (operator times include its Python cost)" if fs.flops is not None else ""
        notes.append(f"no {unit} of lmprof's profiled window completed: the operators and blocks come from the "
                     f"figures step (warm-up {unit} {self.ctx.plan.figures_at}, recorded with memory events{flops}), "
                     "a first call's profile")
        seen = self.ctx.observed
        if fs.probes.forwards:
            seen.input_shape = seen.input_shape or fs.probes.input_shape
            if fs.probes.trains and fs.probes.backwards and seen.backwards_per_step is None:
                seen.counted(fs.probes, 1)
        return ProfiledPhase(trace_path=path, ops=[], steps=1, stand_in=True)
