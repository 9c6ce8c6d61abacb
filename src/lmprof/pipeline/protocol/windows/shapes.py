"""The token shapes of each clean and profiled training step: what the model's top-level forwards ran on;
and the dtype the forwards' matmuls ran in (autocast, TF32), of training steps and generations.

A loop whose batches are padded to their longest sequence (Hugging Face's collators, length grouping)
runs a different shape every step. Its FLOPs then differ step to step, and one step's shape (the
figures step's) does not give the others' FLOPs: an MFU of that step's FLOPs over the clean steps'
median time was a number of no step (a 4 x 16 step's FLOPs over the time of steps up to 4 x 128).
This window keeps, per step, the (batch, sequence) of every forward (a micro-batch each), and per
clean step its time beside them, so the figures can count each step's own FLOPs
(finish/figures.py). A forward without grad (an evaluation inside the step) is not the step's
training work and is not recorded. One forward pre-hook on the model, from the first clean step to the end of the
profiled window: a tuple read per forward; it also marks each step's first forward, which ends the step's
wait for its input (timing.py: StepClock.wait), for every door.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from lmprof.pipeline.protocol.plan import Phase
from lmprof.pipeline.protocol.saves import save_spy
from lmprof.pipeline.protocol.windows.base import Context, Window
from lmprof.workloads.hf_interface import forward_tokens
from lmprof.workloads.hooks import never_compiled, takes_hooks
from lmprof.workloads.precision import dtype_name

Shape = tuple[int, int]


def first_matmul_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first submodule with a 2-D weight that is not an embedding (a Linear, transformers' Conv1D):
    called inside the model's forward, under whatever autocast that forward enters."""
    for m in model.modules():
        w = getattr(m, "weight", None)
        if (m is not model and isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_floating_point()
                and not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and takes_hooks(m)):
            return m
    return None


@dataclass
class StepShapes:
    """(seconds, forwards' shapes) of each clean step, and the forwards' shapes of each profiled step."""

    clean: list[tuple[float, tuple[Shape, ...]]] = field(default_factory=list)
    profiled: list[tuple[Shape, ...]] = field(default_factory=list)
    # The autocast dtype each recorded forward ran under (None: no autocast), and whether an fp32 forward on
    # CUDA ran with TF32 matmuls allowed: the dtype the matmuls ran in, whose peak MFU is against
    autocast: set[str | None] = field(default_factory=set)
    # the same read at the model's own call, where the first matmul module's was never called
    autocast_outer: set[str | None] = field(default_factory=set)
    tf32: bool = False
    evaluated: int = 0  # clean steps that also ran the model without grad (an evaluation)
    saved: int = 0  # clean steps that also saved a checkpoint (torch.save)
    # the times of the clean steps that did either (the values kept in Timings.steps): the step time leaves
    # them out, as known work that is not the training step's
    aside_s: list[float] = field(default_factory=list)
    profiled_aside: list[int] = field(default_factory=list)  # profiled steps (from 0) that did either

    def training(self, seconds: list[float]) -> list[float]:
        """``seconds`` (the clean steps' times) without the steps that also ran an evaluation or saved a
        checkpoint, unless every one did (then there is nothing else to time)."""
        out = list(seconds)
        for s in self.aside_s:
            if s in out:
                out.remove(s)
        return out or list(seconds)

    def compute_dtype(self, params: str) -> tuple[str, str | None]:
        """The dtype the steps' matmuls ran in, for weights of dtype ``params``, and a note where it is not
        the weights' (or cannot be told): autocast's when every recorded forward ran under one, ``tf32``
        for fp32 matmuls on CUDA with TF32 allowed."""
        seen = self.autocast or self.autocast_outer
        if len(seen) > 1:
            return params, (f"the steps' forwards ran under different autocast settings "
                            f"({', '.join(sorted(d or 'none' for d in seen))}): MFU is against the "
                            f"{params} peak of the weights")
        (dt,) = seen or {None}
        if dt is not None and dt != params:
            return dt, (f"autocast: the forwards ran under {dt} autocast, weights in {params}; MFU is against the "
                        f"{dt} peak, what the matmuls ran in")
        if params == "fp32" and self.tf32:
            return "tf32", ("TF32: fp32 matmuls on CUDA with TF32 allowed (torch.backends.cuda.matmul.allow_tf32, "
                            "set_float32_matmul_precision('high')) run on tensor cores; MFU is against the TF32 peak")
        return params, None

    def per_step(self) -> tuple[Shape, float, float] | None:
        """(the first forward's shape, batches and tokens per clean step on average), where every clean step
        has its forwards' shapes; None otherwise. What the probes see in their steps, for a compiled model,
        whose probes see no forward."""
        steps = [forwards for _, forwards in self.clean]
        if not steps or not all(steps):
            return None
        n = len(steps)
        return steps[0][0], sum(len(f) for f in steps) / n, sum(tokens for tokens, _ in self.tokens()) / n

    def tokens(self) -> list[tuple[int, float]]:
        """(tokens, seconds) of each clean step: its forwards' batch x sequence, and its time."""
        kept = self.training([s for s, _ in self.clean])
        return [(sum(b * t for b, t in forwards), s) for s, forwards in self.clean if s in kept]

    @property
    def varied(self) -> bool:
        """Whether the clean steps ran different shapes (a complete record of each is needed)."""
        seen = {shapes for _, shapes in self.clean}
        return len(seen) > 1 and all(seen)


class ShapesWindow(Window):
    """Records what each clean and profiled training step's forwards ran on."""

    name = "shapes"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.record = StepShapes()
        self._hooks: list[Any] = []  # the model's pre-hook (shapes; in clean steps, the dtype too)
        self._dtype_hook: Any = None  # the first matmul module's, clean steps only: autocast inside the forward
        self._inner = False  # autocast is read at the first matmul module's pre-hook, not the model's
        self._reads = False  # the running step reads the dtype (a clean one, or none was read yet)
        # The first matmul module's read is done for the running step: one read a step is enough (a decode loop's
        # forwards take well under a millisecond, and each read in a forward cost it about 10 us on a CPU)
        self._inner_read = False
        self._started = False
        self._evaluated = False  # the running step ran a forward without grad (an evaluation)
        self._saved = False  # the running step called torch.save (a checkpoint)
        self._saves = save_spy(self._saw_save)  # torch.save, patched while the window runs
        self._now: list[Shape] = []
        self._complete = True  # every forward of the running step had token ids of two dimensions
        self._timed = 0  # clean steps timed when the running one began

    @property
    def active(self) -> bool:
        return bool(self._hooks) or self._dtype_hook is not None

    def step_begins(self, step: int) -> None:
        phase = self.ctx.plan.phase_of(step)
        # The dtype is read in the clean steps (or, in a script too short for them, in the first steps after
        # warm-up): once read, nothing of it runs inside the profiled steps, where a hook's time is the
        # blocks' "other" (nanoGPT's rose from 3.5% past the 5% goal with it)
        self._reads = phase is Phase.CLEAN or not (self.record.autocast or self.record.autocast_outer)
        self._inner_read = False
        if not self._reads and self._dtype_hook is not None:
            self._dtype_hook.remove()
            self._dtype_hook = None
        if phase not in (Phase.CLEAN, Phase.PROFILED):
            return
        if not self._started:
            self.start()
        self._now, self._complete, self._timed, self._evaluated = [], True, len(self.ctx.timings.steps), False
        self._saved = False

    def start(self) -> None:
        seen, trains = self.ctx.observed, self.ctx.spec.traits.trains
        # a compiled model: its wrapper's hook, outside the compiled code (none inside: it would recompile)
        target = seen.outer if seen.compiled else seen.model
        if target is None:
            return  # no model yet (a script's first optimizer step names it): the next step tries again
        self._started = True
        if not takes_hooks(target):
            return
        if trains:  # generations: their dtype only (a generation's shapes are its own, timing.py)
            self._hooks.append(target.register_forward_pre_hook(never_compiled(self._forward), with_kwargs=True))
            self._saves.install()  # a step that saves a checkpoint is known work, not the training step's
        # Autocast is read inside the forward where lmprof may hook inside: Accelerate (and the HF Trainer)
        # enter it inside model.forward, after the model's own pre-hooks ran
        inner = None if seen.compiled or not self._reads else first_matmul_module(target)
        if inner is not None:
            self._dtype_hook = inner.register_forward_pre_hook(never_compiled(self._inner_forward))
            self._inner = True

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.ctx.clock.forward_began()  # the step's wait for its input ends at its first forward (timing.py)
        if not torch.is_grad_enabled():
            self._evaluated = True  # an evaluation in the step (no_grad): not its training work (StepShapes.training)
            return
        if self._reads:
            self._compute(self.record.autocast_outer if self._inner else self.record.autocast)
        tokens = forward_tokens(args, kwargs)[1]
        if tokens is not None:
            self._now.append(tokens)
        else:
            self._complete = False

    def _inner_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self._inner_read:
            return
        if torch.is_grad_enabled() or not self.ctx.spec.traits.trains:  # training: not an evaluation's
            self._compute(self.record.autocast)
            self._inner_read = True

    def _compute(self, into: set[str | None]) -> None:
        """What this forward's matmuls run in (``into``): autocast's dtype on the model's device type; TF32 on
        CUDA."""
        kind = self.ctx.observed.device.kind if self.ctx.observed.device is not None else "cpu"
        with contextlib.suppress(RuntimeError, AttributeError, TypeError):  # a device type autocast does not know
            on = torch.is_autocast_enabled(kind)
            into.add(dtype_name(torch.get_autocast_dtype(kind)) if on else None)
            if kind == "cuda" and not on and torch.backends.cuda.matmul.allow_tf32:
                self.record.tf32 = True

    def step_ends(self, step: int) -> None:
        if not self._hooks:
            return
        phase, shapes = self.ctx.plan.phase_of(step), tuple(self._now) if self._complete else ()
        steps = self.ctx.timings.steps
        if not self.ctx.spec.traits.trains:
            pass  # a generation's shapes are its own (timing.py); only its dtype is read here
        elif phase is Phase.CLEAN and len(steps) > self._timed:
            self.record.clean.append((steps[-1], shapes))
            self.record.evaluated += self._evaluated
            self.record.saved += self._saved
            if self._evaluated or self._saved:
                self.record.aside_s.append(steps[-1])
        elif phase is Phase.PROFILED:
            if self._evaluated or self._saved:
                self.record.profiled_aside.append(len(self.record.profiled))
            self.record.profiled.append(shapes)
        if self.ctx.plan.window_completes(step):
            self.stop()

    def _saw_save(self) -> None:
        self._saved = True

    def stop(self) -> None:
        for hook in [*self._hooks, *([self._dtype_hook] if self._dtype_hook is not None else [])]:
            hook.remove()
        self._hooks, self._dtype_hook = [], None
        self._saves.remove()

    def abort(self) -> None:
        self.stop()
