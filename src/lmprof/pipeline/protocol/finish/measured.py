"""What a session measured, handed from its finish to the door that assembles the Run.

:func:`measured` is the session's last step: it reads what each window kept (the figures step's
memory, the FLOPs counted, the energy and noise of the clean window, the compile report), the
model's facts and the timings into one typed record, :class:`Measured`. Nothing in it is a live
hook or profiler; :func:`lmprof.pipeline.protocol.finish.assemble.assemble` turns it into the Run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lmprof.hardware.devices import Device
from lmprof.measure.compile_events import CompileReport
from lmprof.measure.flops import aside_note
from lmprof.measure.energy.monitor import EnergyResult
from lmprof.measure.memory import MeasuredMemory
from lmprof.measure.tensor_bytes import static_memory
from lmprof.measure.noise import Snapshot
from lmprof.measure.profiling import ProfiledPhase
from lmprof.measure.other_models import beyond_model
from lmprof.pipeline.protocol.finish.figures import CountedFlops
from lmprof.pipeline.protocol.observed import Known, ModelFacts, Observed, model_facts
from lmprof.pipeline.protocol.plan import PhasePlan
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.windows.shapes import StepShapes
from lmprof.pipeline.protocol.timing import Timings
from lmprof.pipeline.protocol.windows import Windows


@dataclass(frozen=True)
class Described:
    """What the loop's owner says of its run (driver.py): run.json's config, what one training step
    spans, and its own description of the workload (None: read off the model)."""

    config: dict[str, Any]
    step_means: str
    known: Known | None
    hooked_forwards: bool = False  # a hook on the user's model marked each forward's end (inside the generation)


@dataclass
class Measured:
    """Everything a run's record is made of, as the session left it."""

    spec: Spec
    plan: PhasePlan
    folder: Path
    device: Device
    config: dict[str, Any]  # run.json's config, as the driver has it
    step_means: str  # what one training step spans (step_time's note)
    timings: Timings  # clean times, or rough ones marked ``first_call``
    profile: ProfiledPhase | None  # the profiled window's trace (or the figures step's), None: no trace
    notes: list[str]
    facts: ModelFacts
    known: Known | None  # the loop owner's description of its workload, None: read off the model
    compiled: bool
    input_shape: tuple[int, ...] | None
    backwards_per_step: float | None
    forwards_per_step: float | None
    batches_per_step: float | None  # distinct inputs the model ran on per step (probes.py)
    tokens_per_step: float | None  # the token ids in them
    memory: MeasuredMemory | None  # the figures step's
    cache_bytes: int | None  # the KV cache the figures generation's last forward returned
    flops: CountedFlops | None  # counted with FlopCounterMode (a model lmprof has no formulas for)
    recomputes: bool | None  # training: the step recomputed checkpointed activations (None: not seen)
    others: list[Any] | None  # training: other models the step ran forwards of (None: not watched)
    shapes: StepShapes | None  # training: what each clean and profiled step's forwards ran on
    figure_notes: list[str]  # why a FLOP count or the memory measurement is missing
    energy: EnergyResult | None
    noise: tuple[Snapshot, Snapshot] | None  # the machine's counters before and after the clean window
    compile: CompileReport | None
    more: list[Any] = field(default_factory=list)  # results of windows beyond the protocol's own (add_to(run, folder))
    hooked_forwards: bool = False  # generations: lmprof's hooks on the model marked each forward's end


def measured(spec: Spec, plan: PhasePlan, folder: Path, seen: Observed, timings: Timings,
             profile: ProfiledPhase | None, compiled: CompileReport | None, windows: Windows,
             describe: Callable[[ModelFacts], Described]) -> Measured:
    """The record of a finished session (called once its windows are stopped); ``describe``: the
    driver's account of the run, given the model's facts."""
    assert seen.device is not None
    if profile is None or not profile.steps:  # the figures step's recording stands in for a window never completed
        profile = windows.figures.profile(folder, spec.unit) or profile
    facts = model_facts(seen)
    said = describe(facts)
    step = windows.figures.result()
    flops, notes = _flop_count(spec, plan, seen, facts, windows)
    fig = windows.figures
    if step is not None and step.memory is None and fig.step is not None and fig.step.memory_error:
        notes.append(f"no memory measurement: the figures step's recording could not be read back "
                     f"({fig.step.memory_error})")
    if step is None and not fig.gave_way:  # else the figures window said why
        notes.append("no memory measurement: it is taken on a warm-up step, and "
                     + ("--warmup 0 asked for none" if plan.warmup == 0 else "this run had none lmprof saw begin")
                     + " (raise --warmup)")
    # a compiled model's probes see no forward: its wrapper's calls (windows/shapes.py) say what the steps ran on
    shape, batches, tokens = seen.input_shape, seen.batches_per_step, seen.tokens_per_step
    if seen.compiled and (each := windows.shapes.record.per_step()) is not None:
        shape, batches, tokens = shape or each[0], each[1] if batches is None else batches, tokens or each[2]
    return Measured(
        spec=spec, plan=plan, folder=folder, device=seen.device, config=said.config, step_means=said.step_means,
        timings=timings, profile=profile, notes=list(seen.notes), facts=facts, known=said.known,
        compiled=seen.compiled, input_shape=shape,
        backwards_per_step=seen.backwards_per_step, forwards_per_step=seen.forwards_per_step,
        batches_per_step=batches, tokens_per_step=tokens,
        memory=_replaced(step.memory, seen, plan) if step else None, cache_bytes=step.cache_bytes if step else None,
        flops=flops,
        recomputes=seen.recomputes, others=seen.others, shapes=windows.shapes.record,
        figure_notes=notes, energy=windows.meter.energy, noise=windows.meter.noise, compile=compiled,
        more=[r for r in (w.result() for w in windows.more) if r is not None], hooked_forwards=said.hooked_forwards)


def _replaced(memory: MeasuredMemory | None, seen: Observed, plan: PhasePlan) -> MeasuredMemory | None:
    """The figures step's memory, unless the loop re-created its optimizer after it (a warm-up phase with SGD, then
    AdamW): then the optimizer's state is read off the one that stepped the measured steps, live now, and the peak,
    which the replaced one's step set, is n/a (it read 0 B of AdamW state, and a peak below AdamW's own bytes)."""
    if memory is None or seen.optimizer_replaced is None or seen.model is None:
        return memory
    old, at = seen.optimizer_replaced
    if at + 1 < plan.figures_at:
        return memory  # the new one stepped before the figures step began: its state was there to measure
    now = static_memory(seen.model, seen.optimizers)
    new = ", ".join(sorted({type(o).__name__ for o in seen.optimizers}))
    static = dataclasses.replace(memory.static, optimizer=now.optimizer, optimizer_scalars=now.optimizer_scalars)
    return dataclasses.replace(
        memory, static=static, peak=None,
        peak_source=(f"not measured: the loop replaced its {old} with {new} after step {at}, and warm-up step "
                     f"{plan.figures_at}, which measures memory, did not run the {new} with its state in place (its "
                     "steps hold more: the state, its temporaries)"),
        notes=[*memory.notes, f"memory.optimizer is the state of the {new} that stepped the measured steps, read when "
                              f"the run was written: the loop replaced its {old} after step {at}, and the figures "
                              f"step ({plan.figures_at}) measured the rest before that state existed"])


def _flop_count(spec: Spec, plan: PhasePlan, seen: Observed, facts: ModelFacts,
                windows: Windows) -> tuple[CountedFlops | None, list[str]]:
    """The FLOPs FlopCounterMode counted, or the note that says why there are none."""
    step = windows.figures.result()
    where = f"warm-up {spec.unit} {plan.flops_at}, before the timed windows"
    shape = facts.shape
    # a training step's count has what it ran beyond the model's FLOPs in it (recomputation, other models)
    beyond = {"recomputed": bool(seen.recomputes), "others": beyond_model(seen.others, shape is not None)}
    if windows.flops.counted:  # counted on a step of their own (training only)
        return CountedFlops(where=where, step=windows.flops.counted, **beyond), []
    if step is not None and step.flops:
        if spec.traits.generates:
            decode = step.flops - step.prefill_flops if step.prefill_flops else None
            return CountedFlops(where=where, prefill=step.prefill_flops, decode=decode), []
        return CountedFlops(where=where, step=step.flops, **beyond), ([aside_note(step.flops_aside, where)]
                                                                      if step.flops_aside else [])
    if windows.flops.gave_way:
        return None, []  # the window said why already (your own profiler ran in the counting step)
    if shape is None and not seen.compiled and plan.flops_apart:
        return None, [f"no FLOP count: it is taken on warm-up step {plan.flops_at} (apart from the figures step, so "
                      "that the profile has no FlopCounterMode in it), and this run ended before that step did"]
    if shape is None and not seen.compiled:
        return None, ["no FLOP count: it is taken on a warm-up step, and this run had "
                      f"{'none' if plan.warmup == 0 else 'none lmprof saw begin'} (raise --warmup)"]
    if shape is None:
        what = "that departs from its config" if facts.departs else "lmprof has no formulas for"
        return None, [f"no FLOP count for a compiled model {what} (FlopCounterMode would recompile it)"]
    return None, []
