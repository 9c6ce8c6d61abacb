"""The FLOPs step: in training, for a model lmprof has no formulas for, whose backward recomputes
checkpointed activations, or whose step runs other models too (both seen in the figures step), FLOPs
are counted with torch's FlopCounterMode on the warm-up step after the figures step, a step of their own.

Counted in the figures step itself, FlopCounterMode's Python cost per operator (tens of µs) would be
in that step's recording, which is the run's profile when the script ends before lmprof's window: on
a 12-step script with an attention layer, the blocks of that profile came to +459% of the clean step
with it in, +89-123% without. The count gives way to the user's own profiler as the figures step
does: not started under it (its cost would be in their profile), stopped unused when it starts.
"""
from __future__ import annotations


from lmprof.measure.flops import StepFlops, aside_note
from lmprof.measure.window import GiveWay, user_profiler_active
from lmprof.pipeline.protocol.guard import run_guarded
from lmprof.pipeline.protocol.windows.base import Context, Window


class FlopsWindow(Window):
    """Counts one warm-up step's FLOPs (:attr:`counted`), apart from the figures step."""

    name = "flops"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.counter: StepFlops | None = None
        self.counted: int | None = None  # FLOPs of the step (0: stopped before the step ended)
        self.gave_way = False
        self._give_way: GiveWay | None = None

    @property
    def active(self) -> bool:
        return self.counter is not None and self.counted is None

    def step_begins(self, step: int) -> None:
        ctx, seen = self.ctx, self.ctx.observed
        # Counted where lmprof has no formulas, and where the step recomputes checkpointed activations or runs
        # other models (the formulas are model FLOPs; the count is what ran, the hardware FLOPs).
        if not (ctx.plan.flops_apart and step == ctx.plan.flops_at and seen.model is not None
                and self.counter is None and not seen.compiled
                and (seen.shape() is None or seen.recomputes or seen.others)):
            return
        if user_profiler_active():
            self.gave_way = True
            seen.notes.append(f"no FLOP count: your own torch.profiler was running when warm-up step {step}, which "
                              "counts them, began (FlopCounterMode's cost per operator would have been in your profile)")
            return
        self.start()

    def start(self) -> None:
        self.counter = StepFlops(self.ctx.observed.model)  # the model's evaluations in the step: apart
        self.counter.start()
        self._give_way = GiveWay(lambda: run_guarded(self.ctx, self._user_profiler_starts))
        self._give_way.install()

    def boundary(self) -> None:
        self.stop()

    def stop(self, keep: bool = True) -> None:
        """End the count: kept (``keep``) or dropped (0)."""
        if self._give_way is not None:
            self._give_way.remove()
            self._give_way = None
        if self.counter is not None and self.counted is None:
            counted = self.counter.stop()
            self.counted = counted if keep else 0
            if keep and self.counter.aside:
                self.ctx.observed.notes.append(aside_note(self.counter.aside, f"warm-up step {self.ctx.plan.flops_at}"))

    def abort(self) -> None:
        self.stop(keep=False)  # ended inside its step: no count

    def _user_profiler_starts(self) -> None:
        if self.active:
            self.abort()
            self.gave_way = True
            self.ctx.observed.notes.append(
                f"no FLOP count: your own torch.profiler started during warm-up step {self.ctx.plan.flops_at}, which "
                "counts them: lmprof stopped counting (FlopCounterMode's cost per operator would have been in your "
                "profile)")
