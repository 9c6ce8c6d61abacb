"""The protocol run from inside someone else's loop: a state machine fed with step boundaries.

The user's code drives the steps; lmprof only observes. Steps are counted from the first boundary:

    warm-up (W steps)  ->  clean window (S steps: device synced at each boundary, nothing else)
    ->  profiler warm-up (1 step under the profiler, no step range)
    ->  profiled window (P steps: torch.profiler, ProfilerStep ranges, probes)  ->  done

Training: a boundary is the end of an optimizer step (or ``prof.step()``); a step is the time
between two boundaries, everything the loop does included (data, logging, several backward passes
with gradient accumulation). Inference: a step is one generation, from the start of ``generate`` to
its return; its first top-level forward is the prefill, the later ones decode steps.

When the script ends before the window is complete, :meth:`Session.finish` writes what was
measured and says what happened in :attr:`Session.message`. A script too short for a clean figure
(one ``generate()``, three training steps) still gets a run: the figures step (the second warm-up
step, or the only one) is recorded under a profiler anyway, so its trace gives the operators and
blocks, and the warm-up steps are timed, which gives rough timings marked as a first call.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from lmprof import gc_hold
from lmprof.hardware.devices import Device, resolve_device
from lmprof.measure.compile_events import MEASURED, CompileWatch
from lmprof.measure.compile_events import baseline as compile_baseline
from lmprof.measure.flops import StepFlops
from lmprof.measure.energy import EnergyMonitor
from lmprof.measure.energy.monitor import EnergyResult
from lmprof.measure.noise import Snapshot, snapshot
from lmprof.measure.profiling import ProfiledPhase
from lmprof.measure.window import GiveWay, ProfilerWindow, user_profiler_active
from lmprof.pipeline.protocol.folder import run_folder
from lmprof.pipeline.protocol.plan import Phase, PhasePlan
from lmprof.pipeline.usercode.ending import StopAgain
from lmprof.pipeline.usercode.guard import failure_line, guarded, safe_name
from lmprof.pipeline.usercode.figures_step import FiguresStep, StepFigures
from lmprof.pipeline.usercode.probes import Probes
from lmprof.workloads.hooks import takes_hooks

Mode = Literal["train", "infer"]
DEFAULTS: dict[str, tuple[int, int, int]] = {"train": (3, 10, 3), "infer": (1, 5, 1)}  # as lmprof train / infer


class StopScript(BaseException):
    """Raised into the user's code by ``--stop-after`` once the run is written (not an Exception, so
    a script's ``except Exception`` does not swallow it)."""


@dataclass
class SessionSpec:
    """How a session measures and where it writes."""

    mode: Mode = "train"
    warmup: int | None = None
    steps: int | None = None
    profile_steps: int | None = None
    out: str | Path = "runs"
    run_dir: Path | None = None  # exact folder (torchrun ranks); else a new folder under ``out``
    label: str = "script"
    report: bool = True
    stop_after: bool = False
    verbose: bool = True  # print the summary (to stderr) when the run is written
    energy: str = "auto"  # the energy meter over the clean window (as lmprof train's --energy)
    tdp_w: float | None = None
    plots: bool | None = None  # roofline.png and memory.png; None: drawn when the report is written
    config: dict[str, Any] = field(default_factory=dict)  # extra facts for run.json's config
    # lmprof's own loop drives the session (lmprof train / infer): its step places its own phase
    # scopes; the figures step is the last warm-up step (the driver counts one more for it); lmprof's
    # own failures are raised (there is no user program to protect); finish() does not save (the
    # caller does); the energy window gets the extra steps a meter needs.
    driven: bool = False

    def draws_plots(self) -> bool:
        """Whether this run draws its PNGs: drawing them costs most of a second (matplotlib)."""
        return self.report if self.plots is None else self.plots

    def counts(self) -> tuple[int, int, int]:
        w, s, p = DEFAULTS[self.mode]
        return (w if self.warmup is None else self.warmup, s if self.steps is None else self.steps,
                p if self.profile_steps is None else self.profile_steps)


@dataclass
class Known:
    """What a driver knows of its workload (lmprof train / infer); a user's script leaves it None
    and the session reads the same facts off the model it observes."""

    title: str
    dtype: str
    param_dtype: str
    shape: Any = None
    batch: int | None = None
    seq_len: int | None = None
    attention: Literal["math", "sdpa"] = "math"
    optimizer: str | None = None
    dropout: Any = 0.0
    tokens_per_step: int | None = None
    new_tokens: int = 0
    kv_cache: bool = True
    cache_bytes: int | None = None  # the KV cache after a generation, as the driver's decoder holds it


@dataclass
class Generation:
    """One clean generation's timings (seconds) and sizes."""

    prefill_s: float
    decode_s: list[float]
    e2e_s: float
    batch: int | None
    prompt_len: int | None
    forwards: int


class Session:
    """Counts steps and runs the measurement protocol at each boundary."""

    def __init__(self, spec: SessionSpec, clock: Callable[[], float] = time.perf_counter):
        # the console command's start-up is over: nothing is measured, and no user code runs, with the
        # collector held off (lmprof/gc_hold.py)
        gc_hold.release()
        self.spec = spec
        self.warmup, self.steps, self.profile_steps = spec.counts()
        self.clock = clock
        self.model: torch.nn.Module | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.device: Device | None = None
        self.notes: list[str] = []
        self.compiled = False
        self.k = 0  # completed steps
        self.samples: list[float] = []  # clean step seconds (train)
        self.gens: list[Generation] = []  # clean generations (infer)
        self.window: ProfilerWindow | None = None
        self.probes: Probes | None = None
        self.folder: Path | None = None
        self.run: Any = None
        self.message: str | None = None
        self.done = False
        self.backwards_per_step: float | None = None
        self.forwards_per_step: float | None = None
        self.input_shape: tuple[int, ...] | None = None
        self._last: float | None = None
        self._noise_before: Snapshot | None = None
        # Machine counters around the clean window (before, after), for the run's noise verdict.
        self.noise_window: tuple[Snapshot, Snapshot] | None = None
        self._gen: dict[str, Any] | None = None
        self._infer_handles: list[Any] = []
        self._on_done: list[Callable[[], None]] = []
        self.failed = False  # lmprof itself failed: the session ended, one line said so
        self._finishing = False
        self._ending = False  # finish() was called because the script (or the with-block) ended
        self.aside = 0  # steps the user's own profiler covered: lmprof stepped aside for them
        self._busy = False  # the user's profiler was on at the last boundary
        self._give_way: GiveWay | None = None
        self.stop_again: StopAgain | None = None  # --stop-after's second chance (ending.py)
        self.pid = os.getpid()
        self.forked_in_window = False
        self.figures_step: FiguresStep | None = None  # the last warm-up step: memory and FLOPs
        # Training, a model lmprof has no formulas for, a warm-up step after the figures step: FLOPs are
        # counted there, so the figures step's recording has no FlopCounterMode in it (see _count_apart).
        self.flops_step: StepFlops | None = None
        self.flops_counted: int | None = None
        self._flops_give_way: GiveWay | None = None
        # the user's own profiler kept the figures step / the FLOP count from being taken (a note says so)
        self.figures_gave_way = self.flops_gave_way = False
        self._figures_give_way: GiveWay | None = None
        self.kineto_ran = False  # lmprof started a profiler in this process (figures step or window)
        self.step_figures: StepFigures | None = None
        self.monitor: EnergyMonitor | None = None
        self._metering = False  # the monitor's window is open (the clean window began)
        self.energy: EnergyResult | None = None
        self._stopped: ProfilerWindow | None = None  # the completed window, stopped, its trace not yet written
        self.collected = False  # the profiled window completed: only the run's assembly is left
        # Timings that are not clean, by where they were taken: the run falls back on them (marked
        # "first call") only when no clean step was timed. Steps under lmprof run: step 1 is untimed.
        self.rough: dict[str, list[float]] = {}
        self.rough_gens: dict[str, list[Generation]] = {}
        self._kind: str | None = None  # what the running training step is: first, figures, warm-up
        self.first_call: str | None = None  # the run's timings are rough ones: where they came from
        self.watch: CompileWatch | None = None  # a compiled model's dynamo records and kernels
        self._dynamo_before = compile_baseline()  # what was compiled before this session began
        self.known: Known | None = None
        self.stopwatch: dict[Any, float] | None = None  # a driver's stopwatch pass: (block, phase) -> ms
        self.generations_without_forward = 0  # generations in which the model's hooks saw no forward  # set in a child forked while lmprof's profiler ran  # the session belongs to this process: forked children do nothing

    # -- setup -------------------------------------------------------------------------------
    def attach(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None = None,
               compiled: bool = False) -> None:
        """The model whose blocks are scoped (and where it runs)."""
        self.model = model
        self.optimizers = list(optimizers or [])
        self.compiled = compiled
        if not takes_hooks(model):
            self.notes.append("TorchScript: the model is a ScriptModule, which takes no hooks, so lmprof placed none: "
                              "its forward is not split into blocks (operators, phases after the forward, and the "
                              "step's figures are measured as usual)")
        p = next(model.parameters(), None)
        self.device = resolve_device(str(p.device) if p is not None else "cpu")
        if compiled and self.watch is None and not self.spec.driven:
            try:  # compilations, recompilations and graph breaks of the user's compiled model, per phase
                self.watch = CompileWatch.start(since=self._dynamo_before)
            except Exception as exc:  # noqa: BLE001 - a missing compile report is a missing figure
                self.notes.append(f"torch.compile: its compilations could not be watched ({type(exc).__name__}: {exc})")
        if self.spec.energy != "off" and self.monitor is None:
            try:  # a meter that cannot start is a missing figure (n/a, said in the record), never a failure
                self.monitor = EnergyMonitor.for_device(self.device, self.spec.energy, tdp_w=self.spec.tdp_w)
            except Exception as exc:  # noqa: BLE001
                self.notes.append(f"energy: no meter ({type(exc).__name__}: {exc})")

    def on_done(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the session ends (triggers remove their hooks there)."""
        self._on_done.append(fn)

    @guarded
    def begin(self) -> None:
        """Mark step 0's start (``lmprof.profile``): with no warm-up, the first step is then timed."""
        if self.spec.mode == "infer":
            self.generation_begin()
        elif self.warmup == 0:
            self._warmup_done()
        else:
            self._next_step_starts()

    def _sync(self) -> None:
        if self.device is not None:
            self.device.synchronize()

    def _mark(self) -> float:
        self._sync()
        self._last = self.clock()
        return self._last

    @property
    def plan(self) -> PhasePlan:
        """The phases of this session's steps (counts as they stand: a driver may lengthen the clean window)."""
        compiled_or_driven = self.compiled or self.spec.driven
        figures_at = self.warmup if compiled_or_driven else min(2, self.warmup)
        return PhasePlan.of(self.warmup, self.steps, self.profile_steps, figures_at=figures_at,
                            flops_apart=self.spec.mode == "train" and not self.spec.driven)

    @property
    def gap(self) -> int:
        return self.plan.gap

    @property
    def clean_steps(self) -> int:
        """Steps between warm-up and the profiler's warm-up step: the clean window, or the gap of ``--steps 0``."""
        return self.plan.clean_steps

    @property
    def needed(self) -> int:
        """Steps (generations) a script needs for the whole protocol."""
        return self.plan.needed

    # -- training ----------------------------------------------------------------------------
    @guarded
    def boundary(self) -> None:
        """A training step ended (an optimizer step, ``prof.step()``, a Trainer step)."""
        if self.done or self.collected:
            return
        if self.spec.mode == "infer":
            self.generation_end()
            if not self.done:
                self.generation_begin()
            return
        self._figures_end()  # before asking whether a profiler runs: the figures step's is lmprof's own
        if self.window is None and self._stepped_aside(user_profiler_active()):
            return
        self.k += 1
        plan = self.plan
        if self.k == 1 and plan.warmup == 0 and self._last is None:
            self.k = 0  # nothing marked a start (lmprof run): the first optimizer step only marks one
        phase = plan.phase_of(self.k) if self.k else Phase.WARMUP
        if phase is Phase.WARMUP and self.k:
            self._rough_step_ended()
        if plan.warmup_ends(self.k + 1):
            self._warmup_done()
            return
        if phase is Phase.WARMUP:
            self._next_step_starts()
            return
        if phase in (Phase.GAP, Phase.CLEAN):
            start = self._last
            now = self._mark()
            if start is not None and plan.timed(self.k):
                self.samples.append(now - start)
            if plan.clean_ends(self.k):
                self._end_clean()
                self._start_window()
            return
        self._sync()  # the profiled step's range ends when the device is done, as in lmprof train
        assert self.window is not None and self.probes is not None
        self.probes.step_end()
        j = plan.profiled_index(self.k)  # profiled steps completed
        now = self.clock()
        if j > 0 and self._last is not None:  # timed under the profiler: a rough figure, used only without clean ones
            self.rough.setdefault("profiled", []).append(now - self._last)
        self._last = now
        if j == 0:  # the profiler's warm-up step ended: count from here
            self.probes.forwards = self.probes.backwards = 0
        else:
            self.window.close_step()
        if plan.window_completes(self.k):
            self._collect()
        else:
            self.window.open_step()

    def _warmup_done(self) -> None:
        """Warm-up ended: the clean window starts now, or (``--steps 0``) the untimed gap step."""
        self._figures_end()
        self._warm()
        if self.plan.clean_begins(self.k + 1):
            self._begin_clean()
        self._mark()

    def _rough_step_ended(self) -> None:
        """A warm-up step ended: time it (device synchronized) as a rough figure, kept by what it was."""
        start, kind = self._last, self._kind
        now = self._mark()
        if start is not None and kind is not None:
            self.rough.setdefault(kind, []).append(now - start)
        self._kind = None

    @property
    def figures_at(self) -> int:
        """Which warm-up step is the figures step: the second (the optimizer's state exists, and a
        three-step script reaches it), the only one, or the last for a compiled model (its second
        call may still compile). 0: none."""
        return self.plan.figures_at

    @property
    def flops_apart(self) -> bool:
        """Whether FLOPs are counted on the warm-up step after the figures step instead of in it: in
        training, where there is one. FlopCounterMode's Python cost per operator would otherwise be in
        the figures step's recording, which is the run's profile when the script ends before lmprof's
        window (a short script): small operators looked several times their size."""
        return self.plan.flops_apart

    @property
    def flops_at(self) -> int:
        """Which warm-up step FLOPs are counted on (for a model lmprof has no formulas for)."""
        return self.plan.flops_at

    def _count_apart(self) -> bool:
        """Whether the step starting now is the one that counts FLOPs on its own."""
        return (self.flops_apart and self.k + 1 == self.flops_at and self.model is not None
                and self.flops_step is None and not self.compiled and self._shape() is None)

    def _stepped_aside(self, busy: bool) -> bool:
        """Whether the step ending now ran under the user's own profiler (on at its start or at its
        end): it is not counted, so no clean step is timed under a profiler and lmprof never opens
        one inside the user's."""
        tainted, self._busy = busy or self._busy, busy
        if not tainted or self.k < self.warmup:
            return False
        self.aside += 1
        if busy:
            self._last = None
        else:
            self._mark()  # the next step starts clean here
        return True

    @guarded
    def _user_profiler_starts(self) -> None:
        """The user's own profiler is starting while lmprof's window runs: lmprof's stops first,
        unwritten, and the run keeps the clean figures."""
        if self.window is not None:
            self.window.abort()
            self.window = None
        self.notes.append("your own torch.profiler started during lmprof's profiled window: lmprof stopped its "
                          "profiler (two cannot run at once) and kept the clean timings only")
        self.finish("your own torch.profiler started")

    def _next_step_starts(self) -> None:
        """Step ``k + 1`` (a warm-up one) starts now; the figures step is one of them."""
        self._kind = "first" if self.k == 0 else "warm-up"
        if self.k + 1 == self.figures_at and self.figures_step is None and self.model is not None:
            if user_profiler_active():
                self.figures_gave_way = True
                self.notes.append("your own torch.profiler ran during the figures step (a warm-up step): no memory "
                                  f"{'measurement' if self.flops_apart else 'or FLOP count'} was taken (lmprof never "
                                  "runs a profiler inside yours)")
                return
            assert self.device is not None
            describe = self._shape() is None and not self.compiled and not self.flops_apart
            # On CUDA the step's allocation history goes into the run folder (memory_snapshot.pickle).
            snapshot_dir = self._folder() if self.device.kind == "cuda" else None
            self.figures_step = FiguresStep(self.model, self.optimizers, self.device, self.spec.mode,
                                            count_flops=describe, compiled=self.compiled,
                                            phases=not self.spec.driven, snapshot_dir=snapshot_dir)
            self.kineto_ran = True
            self.figures_step.start()
            self._figures_give_way = GiveWay(self._user_profiler_in_figures_step)  # after lmprof's own profiler started
            self._figures_give_way.install()
            self._kind = "figures"
        if self._count_apart():
            self._start_counting()
        if self.spec.mode == "train":
            self._mark()  # after the figures step's profiler started: its start is not in the step's time

    def _figures_end(self) -> None:
        self._flops_end()
        if self.figures_step is not None and self.figures_step.active:
            self._sync()
            self.figures_step.stop()
        if self._figures_give_way is not None:  # only the figures step's: the window's stays while it runs
            self._figures_give_way.remove()
            self._figures_give_way = None

    def _start_counting(self) -> None:
        """The step that counts FLOPs begins (FlopCounterMode is no profiler, but its cost per operator
        would be in the user's profile: it gives way to theirs as the figures step does)."""
        if user_profiler_active():
            self.flops_gave_way = True
            self.notes.append(f"no FLOP count: your own torch.profiler was running when warm-up step {self.flops_at}, "
                              "which counts them, began (FlopCounterMode's cost per operator would have been in "
                              "your profile)")
            return
        self.flops_step = StepFlops()
        self.flops_step.start()
        self._flops_give_way = GiveWay(self._user_profiler_in_flops_step)
        self._flops_give_way.install()
        self._kind = "counting"

    def _flops_end(self, keep: bool = True) -> None:
        """End the step that counts FLOPs: its give-way removed, its count kept (``keep``) or dropped."""
        if self._flops_give_way is not None:
            self._flops_give_way.remove()
            self._flops_give_way = None
        if self.flops_step is not None and self.flops_counted is None:
            counted = self.flops_step.stop()
            self.flops_counted = counted if keep else 0

    @guarded
    def _user_profiler_in_flops_step(self) -> None:
        """The user's profiler starts inside the step that counts FLOPs: the count stops, unused."""
        if self.flops_step is not None and self.flops_counted is None:
            self._flops_end(keep=False)
            self.flops_gave_way = True
            self.notes.append(f"no FLOP count: your own torch.profiler started during warm-up step {self.flops_at}, "
                              "which counts them: lmprof stopped counting (FlopCounterMode's cost per operator "
                              "would have been in your profile)")

    @guarded
    def _user_profiler_in_figures_step(self) -> None:
        """The user's profiler starts inside the figures step: lmprof's stops first, keeping nothing."""
        counting = self.figures_step is not None and self.figures_step.flops is not None
        self.figures_gave_way = True
        if self.figures_step is not None:
            self.figures_step.abort()
            self.figures_step = None
        if self._figures_give_way is not None:
            self._figures_give_way.remove()
            self._figures_give_way = None
        self.notes.append("your own torch.profiler started during the figures step (a warm-up step): lmprof stopped "
                          "its memory recording (two profilers cannot run at once): no memory "
                          f"{'or FLOP count' if counting else 'measurement'}")
        self._kind = None

    def _shape(self) -> Any:
        """lmprof's description of the model (None when it has none); looked up once."""
        if not hasattr(self, "_shape_cache"):
            from lmprof.workloads.describe import describe_module

            self._shape_cache = describe_module(self.model) if self.model is not None else None
        return self._shape_cache

    def _warm(self) -> None:
        """Warm-up is over: a compile watch moves on; a driven energy window grows to what the meter needs."""
        if self.watch is not None:
            first = self.rough.get("first") or [g.e2e_s for g in self.rough_gens.get("first", [])]
            self.watch.first_call_s = first[0] if first else None
            self.watch.phase(MEASURED)
        if self.spec.driven and self.monitor is not None and self.monitor.available and not self.gap:
            # The fastest warm-up step after the first: a faster step needs more of them, so this errs long.
            warm = [t for k, v in self.rough.items() if k != "first" for t in v]
            warm += [g.e2e_s for k, v in self.rough_gens.items() if k != "first" for g in v]
            if warm:
                self.steps += self.monitor.extra_steps(step_s=min(warm), steps=self.steps)

    def _begin_clean(self) -> None:
        self._noise_before = snapshot()
        if self.monitor is not None:
            self.monitor.begin()
            self._metering = True

    def _end_clean(self) -> None:
        if self.watch is not None:
            self.watch.count(MEASURED, len(self.samples) or len(self.gens))
            self.watch.phase("profiled")
        if self._noise_before is not None:
            self.noise_window = (self._noise_before, snapshot())
        if self.monitor is not None and self._metering:
            monitor, self.monitor = self.monitor, None
            self.energy = monitor.end()
            monitor.close()

    @guarded
    def optimizer_begin(self) -> None:
        for probes in self._live_probes():
            probes.optimizer_begin()

    @guarded
    def optimizer_end(self) -> None:
        for probes in self._live_probes():
            probes.optimizer_end()

    def _live_probes(self) -> list[Probes]:
        live = [self.probes] if self.probes is not None else []
        if self.figures_step is not None and self.figures_step.active:
            live.append(self.figures_step.probes)
        return live

    def _start_window(self) -> None:
        folder = self._folder()
        assert self.device is not None
        self.window = ProfilerWindow(self.device.torch_device, folder / "trace.json.gz")
        self.probes = Probes(self.model, self.spec.mode, blocks=not self.compiled, phases=not self.spec.driven)
        self.probes.install(self.optimizers)
        self.kineto_ran = True
        self.window.start()
        self._give_way = GiveWay(self._user_profiler_starts)
        self._give_way.install()

    def _folder(self) -> Path:
        if self.folder is None:
            assert self.device is not None
            label = safe_name(self.spec.label)
            self.folder = self.spec.run_dir or run_folder(self.spec.out, self.spec.mode, label, self.device)
            self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    # -- inference ---------------------------------------------------------------------------
    @guarded
    def generation_begin(self, model: torch.nn.Module | None = None, args: tuple[Any, ...] = (),
                         kwargs: dict[str, Any] | None = None) -> None:
        """A generation starts (``generate`` was called, or ``prof.step()`` in inference mode)."""
        if self.done or self.collected:
            return
        if self.model is None and model is not None:
            self.attach(model)
        if self.window is None and self.k >= self.warmup and user_profiler_active():
            self.aside += 1  # under the user's profiler: not counted (see _stepped_aside)
            self._gen = {"aside": True}
            return
        if (self.model is not None and not self._infer_handles and not self.spec.driven
                and takes_hooks(self.model)):
            self._infer_handles.append(self.model.register_forward_hook(self._forward_end, with_kwargs=True, always_call=True))
        g = self.k + 1  # the generation starting now
        plan = self.plan
        phase = plan.phase_of(g)
        ids = (kwargs or {}).get("input_ids", args[0] if args else None)
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self._gen = {"g": g, "t0": None, "fwd": [], "shape": shape}
        if plan.window_starts(g):
            self._start_window()
        if phase is Phase.WARMUP:
            self._next_step_starts()
            self._gen["kind"] = self._kind
        if plan.warmup_ends(g):
            self._figures_end()
            self._warm()
            if plan.clean_begins(g):
                self._begin_clean()
        # Every generation is timed; the warm-up and profiled ones only as rough figures (see finish).
        self._gen["t0"] = self._mark()
        if self.window is not None and phase is Phase.PROFILED:
            self.window.open_step()
        if self.probes is not None and self.probes.active:
            self.probes.generation_begin()

    @guarded
    def _forward_end(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        gen = self._gen
        if gen is not None and gen.get("shape") is None and not gen.get("fwd"):  # the prefill's input: batch x prompt
            ids = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
                gen["shape"] = tuple(ids.shape)
        if self.figures_step is not None and self.figures_step.active:
            self.figures_step.forward_end(output)
        if gen is None or self.done or gen.get("t0") is None:
            return
        self._sync()
        gen["fwd"].append(self.clock())
        if self.probes is not None and self.probes.active:
            self.probes.forward_end()

    @guarded
    def prefill_end(self) -> None:
        """A driven generation's prefill ended (its own clock times it; FLOPs counted so far are the prefill's)."""
        if self.figures_step is not None and self.figures_step.active:
            self.figures_step.forward_end(None)

    @guarded
    def generation_end(self, timed: Generation | None = None) -> None:
        """A generation ended; ``timed``: a driver's own timing of it (else the session's clock and hooks)."""
        gen = self._gen
        if gen is None or self.done or self.collected:
            return
        self._gen = None
        if gen.get("aside"):
            return
        plan = self.plan
        g = gen["g"]
        phase = plan.phase_of(g)
        t1 = self._mark() if gen["t0"] is not None else None  # before the figures step's recording stops
        if phase is Phase.WARMUP:
            self._figures_end()
        if t1 is not None and not gen["fwd"]:
            self.generations_without_forward += 1
        if t1 is not None and timed is None and gen["fwd"]:
            timed = self._generation(gen, t1)
        if t1 is not None and timed is not None:
            if phase is Phase.CLEAN:
                self.gens.append(timed)
            elif phase is Phase.WARMUP and gen.get("kind"):
                self.rough_gens.setdefault(gen["kind"], []).append(timed)
            elif phase is Phase.PROFILED:
                self.rough_gens.setdefault("profiled", []).append(timed)
        self.k += 1
        if plan.clean_ends(g):
            self._end_clean()
        if self.probes is not None and self.probes.active:
            self.probes.generation_end()
            if phase is Phase.PROFILER_WARMUP:
                self.probes.forwards = 0
        if self.window is not None and phase is Phase.PROFILED:
            self.window.close_step()
            if plan.window_completes(g):
                self._collect()

    def _generation(self, gen: dict[str, Any], t1: float) -> Generation:
        t0, fwd = gen["t0"], gen["fwd"]
        shape = gen["shape"] or self.input_shape
        self.input_shape = shape
        return Generation(prefill_s=fwd[0] - t0, decode_s=[b - a for a, b in zip(fwd, fwd[1:])], e2e_s=t1 - t0,
                          batch=shape[0] if shape else None, prompt_len=shape[1] if shape else None, forwards=len(fwd))

    # -- the end -----------------------------------------------------------------------------
    @guarded
    def finish(self, reason: str | None) -> Path | None:
        """End the session: stop what runs, write the run from what was measured, say what happened.

        ``reason`` is None when the window completed, else what ended the script early ("the script
        exited (code 0)", "the script raised ValueError", ...). Returns the run folder, or None when
        nothing was measured.
        """
        if self.done or self._finishing:
            return self.folder
        # Not done until written: a failure below leaves the session to fail(), which says so.
        self._finishing, self._ending = True, reason is not None
        if self.collected:
            reason = None  # the window completed: a whole run, whatever ended the script afterwards
        phase_before = self._where()
        try:
            window = self._stopped or self.window
            if window is not None:
                window.stop()  # nothing more when _collect() stopped it already
            profiled = self._export(window) if window is not None else None
        finally:
            self._teardown()
        unit = "generation" if self.spec.mode == "infer" else "step"
        if self.aside:
            self.notes.append(f"your own torch.profiler ran during {self.aside} {unit}(s): lmprof stepped aside for "
                              f"them (it never opens a profiler inside yours, and a {unit} timed under a profiler is "
                              f"not clean); every {unit} measured here ran outside it")
        if not (self.samples or self.gens):
            self._use_rough(unit)
        measured = bool(self.samples) or bool(self.gens)
        if not measured:
            self._close_watch()  # nothing to report it in
            self.message = self._nothing_message(reason)
            if self.folder is not None and self.folder.is_dir() and not any(self.folder.iterdir()):
                self.folder.rmdir()
            self.done = True
            return None
        from lmprof.pipeline.usercode.assemble import assemble, write

        self._folder()
        if profiled is None or not profiled.steps:
            profiled = self._figures_profile(unit) or profiled
        self.run = assemble(self, profiled)
        if not self.spec.driven:
            write(self)
        self.done = True
        if reason is not None:
            rough = " (rough first-call timings: see the note)" if self.first_call else ""
            self.message = f"{reason} {phase_before}: wrote what was measured{rough} to {self.folder}"
        elif self.spec.stop_after:
            self.stop_again = StopAgain(f"--stop-after: stopped the script once the run was written to {self.folder}")
            self.stop_again.install()
            raise StopScript()
        return self.folder

    def _export(self, window: ProfilerWindow) -> ProfiledPhase | None:
        """The window's trace written; when the place is full or read-only, the run keeps its clean
        figures (run.json is small and may still fit) and says why it has no operators or blocks."""
        try:
            return window.export()
        except OSError as exc:
            from lmprof.pipeline.usercode.guard import why

            self.notes.append(f"the profiled window's trace could not be written ({why(exc)}): clean timings "
                              "only, no operators or block breakdown")
            return None

    # Where rough timings come from, best first: steps under lmprof's profiler (no first-call costs),
    # plain warm-up steps after the first, the figures step (memory recording on), the very first step.
    _ROUGH = {
        "profiled": "under lmprof's profiler (its overhead included)",
        "warm-up": "during warm-up (caches, allocator and kernel choice still settling)",
        "figures": "while lmprof recorded memory (and counted FLOPs where it has no formulas) during warm-up",
        "counting": "while lmprof counted FLOPs with FlopCounterMode during warm-up",
        "first": "on the very first call (allocation, kernel choice and any compilation included)",
    }

    def _use_rough(self, unit: str) -> None:
        """No clean step was timed: take the steps timed elsewhere, marked as a rough first-call figure."""
        found = self.rough_gens if self.spec.mode == "infer" else self.rough
        kind = next((k for k in self._ROUGH if found.get(k)), None)
        if kind is None:
            return
        if self.spec.mode == "infer":
            self.gens = list(self.rough_gens[kind])
        else:
            self.samples = list(self.rough[kind])
        self.first_call = kind
        n = len(self.gens) or len(self.samples)
        how = ("--steps 1" if self.steps == 0
               else f"--warmup {self.warmup} --steps {self.steps} --profile-steps {self.profile_steps}, or lower them")
        self.notes.append(
            f"first call: includes warm-up costs: no clean {unit} was timed, so the {n} {unit}(s) here were timed "
            f"{self._ROUGH[kind]}: a rough figure, not a clean timing; for a clean one run at least {self.needed} {unit}s "
            f"({how})")

    def _figures_profile(self, unit: str) -> ProfiledPhase | None:
        """The figures step's recording as the run's profile, when no profiled step completed."""
        fs = self.figures_step
        if fs is None or self.folder is None:
            return None
        path = self.folder / "trace.json"
        try:
            if not fs.export_trace(path):
                return None
            fs.result()  # reads the exported file, before the run's assembly compresses it
        except Exception as exc:  # noqa: BLE001 - a missing profile is a missing figure, never a failure
            self.notes.append(f"the figures step's trace could not be written ({type(exc).__name__}: {exc})")
            return None
        flops = " with FlopCounterMode on (operator times include its Python cost)" if fs.flops is not None else ""
        self.notes.append(f"no {unit} of lmprof's profiled window completed: the operators and blocks come from the "
                          f"figures step (warm-up {unit} {self.figures_at}, recorded with memory events{flops}), "
                          "a first call's profile")
        if self.probes is None and fs.probes.forwards:
            self.input_shape = self.input_shape or fs.probes.input_shape
            if self.spec.mode == "train" and fs.probes.backwards and self.backwards_per_step is None:
                self.backwards_per_step = float(fs.probes.backwards)
                self.forwards_per_step = float(fs.probes.forwards)
        return ProfiledPhase(trace_path=path, ops=[], steps=1)

    def _collect(self) -> None:
        """The profiled window completed: stop the profiler and write its trace, remove every hook,
        and leave the rest (loading the trace, figures, the record, the report) to :meth:`finish`,
        which runs when the script, the with-block or the training ends: not inside the user's step."""
        assert self.window is not None
        self.window.stop()  # the trace's export waits for finish(): not inside the user's step
        self._stopped = self.window
        self._teardown()  # while the window is known: its step count divides what the probes saw
        self.window = None
        self.collected = True
        if self.spec.stop_after:
            self.finish(None)

    def _teardown(self) -> None:
        """Remove every hook and patch lmprof placed; each part runs even when another one fails."""
        with contextlib.suppress(Exception):
            self._flops_end(keep=False)  # ended inside its step: no count
        if self.figures_step is not None and self.figures_step.active:
            with contextlib.suppress(Exception):
                self.figures_step.abort()
            self.figures_step = None
        if self._figures_give_way is not None:
            with contextlib.suppress(Exception):
                self._figures_give_way.remove()
            self._figures_give_way = None
        if self.monitor is not None:  # the clean window did not end: no energy figure from a part of it
            with contextlib.suppress(Exception):
                self.monitor.close()
            self.monitor = None
        if self._give_way is not None:
            with contextlib.suppress(Exception):
                self._give_way.remove()
        if self.probes is not None:
            p = max(self.window.complete if self.window else 0, 1)
            if self.probes.backwards:
                self.backwards_per_step = self.probes.backwards / p
            if self.probes.forwards:
                self.forwards_per_step = self.probes.forwards / p
            self.input_shape = self.input_shape or self.probes.input_shape
            with contextlib.suppress(Exception):
                self.probes.remove()
            self.probes = None  # read once: a second teardown (at finish) must not divide again
        for h in self._infer_handles:
            with contextlib.suppress(Exception):
                h.remove()
        self._infer_handles.clear()
        for fn in self._on_done:
            with contextlib.suppress(Exception):
                fn()
        self._on_done.clear()

    def abandon(self) -> None:
        """A driven session's own failure: stop and remove everything; the caller raises it on."""
        self.failed = self.done = True
        self._stop_everything()

    def fail(self, exc: BaseException) -> None:
        """lmprof failed inside the user's program: end the session, keep what was written (every
        file is written atomically, so what is there is whole), and say so in one line."""
        writing = isinstance(exc, OSError) or self._finishing
        self.failed = True
        self._stop_everything()
        self.done = True
        self.message = None
        print(failure_line(exc, writing, continues=not self._ending), file=sys.stderr)

    def _stop_everything(self) -> None:
        """A failure's cleanup: the profiler aborted (nothing of it kept), the compile watch's recorder
        closed, every hook removed; each part runs even when another fails."""
        if self.window is not None:
            with contextlib.suppress(Exception):
                self.window.abort()
        self._close_watch()
        self._teardown()

    def _close_watch(self) -> None:
        """Close a compile watch that no record will report (its kernel recorder stays on otherwise)."""
        if self.watch is not None:
            with contextlib.suppress(Exception):
                self.watch.finish()
            self.watch = None

    def _where(self) -> str:
        w, s, p = self.warmup, self.steps, self.profile_steps
        unit = "generation" if self.spec.mode == "infer" else "step"
        k = self.k
        if k < w:
            return f"after {k} {unit}(s), during warm-up ({w})"
        if self.gap and k == w:  # --steps 0: the one untimed step between warm-up and the window
            return f"after {k} {unit}(s), with warm-up done and none profiled"
        w += self.gap
        if k < w + s:
            return f"after {k} {unit}(s), with {len(self.samples) or len(self.gens)} of {s} clean {unit}s timed and none profiled"
        done = self.window.complete if self.window else 0
        return f"after {k} {unit}(s), with all {s} clean {unit}s timed and {done} of {p} profiled"

    def _nothing_message(self, reason: str | None) -> str:
        what = reason or "the session ended"
        if self.aside:
            unit = "generation" if self.spec.mode == "infer" else "step"
            return (f"{what}: your own torch.profiler was running for {self.aside} {unit}(s), and lmprof steps "
                    f"aside for those (it never runs inside your profiler): nothing measured; for lmprof's figures, "
                    f"run without your profiler or leave it {self.needed} "
                    f"{unit}s outside it")
        if self.spec.mode == "infer" and self.generations_without_forward and not self.gens:
            name = type(self.model).__name__ if self.model is not None else "the model"
            return (f"{what} {self._where()}: nothing measured: no call of {name} was seen in "
                    f"{self.generations_without_forward} timed generation(s); model.forward(x) bypasses the module "
                    f"hooks lmprof times tokens with: call model(x) instead")
        if self.k == 0 and self.spec.mode == "infer":
            return (f"{what} without calling generate(): nothing measured (for your own decoding loop, "
                    "use lmprof.profile(model, infer=True) and call prof.step() after each generation)")
        if self.k == 0:
            return (f"{what} without stepping a torch.optim optimizer: nothing measured (for a loop without "
                    "one, use lmprof.profile(model) and call prof.step() after each step)")
        return (f"{what} {self._where()}: nothing measured; run more steps or lower --warmup "
                f"(needs {self.warmup} + {self.clean_steps} + 1 + {self.profile_steps})")
