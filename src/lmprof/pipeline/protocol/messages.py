"""What a session says when a run ends early: where the protocol stood, and why nothing was measured."""
from __future__ import annotations

from pathlib import Path

from lmprof.pipeline.protocol.giveway import Aside
from lmprof.pipeline.protocol.observed import Observed
from lmprof.pipeline.protocol.plan import PhasePlan


def where(plan: PhasePlan, counted: int, clean: int, profiled: int, unit: str) -> str:
    """How far the protocol got: ``counted`` steps, ``clean`` of them timed, ``profiled`` complete."""
    w, s, p = plan.warmup, plan.steps, plan.profile_steps
    if counted < w:
        return f"after {counted} {unit}(s), during warm-up ({w})"
    if counted < plan.last_clean and s:
        return f"after {counted} {unit}(s), with {clean} of {s} clean {unit}s timed and none profiled"
    if counted < plan.profiler_warmup:
        return f"after {counted} {unit}(s), with warm-up done and none profiled"
    clean_part = f"all {s} clean {unit}s timed" if s else f"no clean {unit} asked for (--steps 0)"
    return f"after {counted} {unit}(s), with {clean_part} and {profiled} of {p} profiled"


def nothing_measured(what: str, plan: PhasePlan, counted: int, clean: int, unit: str, *, infer: bool,
                     seen: Observed, aside: Aside) -> str:
    """Why a run that ended (``what``) measured nothing, and what to change."""
    if aside.total:
        return aside.nothing_measured(what, unit, plan.needed)
    here = where(plan, counted, clean, 0, unit)
    model = type(seen.model).__name__ if seen.model is not None else "the model"
    without_forward = seen.generations_without_forward
    if infer and without_forward and not clean:
        return (f"{what} {here}: nothing measured: no forward of {model} or of its modules was seen in "
                f"{without_forward} generation(s)")
    if counted == 0 and infer:
        return (f"{what} without calling generate(): nothing measured (for your own decoding loop, "
                "use lmprof.profile(model, infer=True) and call prof.step() after each generation)")
    if counted == 0 and seen.unstepped:
        return f"{what}: nothing measured: {seen.unstepped}"
    if counted == 0:
        return (f"{what} without stepping a torch.optim optimizer lmprof could see: nothing measured (an "
                "optimizer step compiled with torch.compile runs no hooks; for such a loop, or one without an "
                "optimizer, use lmprof.profile(model) and call prof.step() after each step)")
    first = " (lmprof run's first optimizer step only marks a start)" if not infer and counted == 1 else ""
    return (f"{what} {here}: nothing measured: no {unit} could be timed{first}; the counts asked for measure "
            f"{plan.layout(unit)}")


def no_step_called(what: str, unit: str, *, trains: bool) -> str:
    """Why ``lmprof.profile()`` measured nothing when its loop never called ``prof.step()`` (``what``: how it ended):
    there the steps are the calls, not the optimizer's steps, which the loop may well have taken."""
    after = ", after the optimizer's step" if trains else ""
    return (f"{what} before any prof.step() call: nothing measured (lmprof.profile() counts a {unit} at each "
            f"prof.step(): call it once per {unit}{after}, inside the with-block)")


def wrote(reason: str, here: str, first_call: bool, folder: Path | None) -> str:
    """What a run that ended early (``reason``, ``here``) wrote, and where."""
    rough = " (rough first-call timings: see the note)" if first_call else ""
    return f"{reason} {here}: wrote what was measured{rough} to {folder}"
