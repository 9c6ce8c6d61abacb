"""A window the whole-run watch profiled by itself (windows/watch.py), as a run folder of its own.

The captured steps are assembled like the run's own profiled window (finish/assemble.py: the trace
read and attributed, blocks and operators), into ``watch/capture-<n>-step<k>/``. Its clean figure is
what the watch measured just before the capture: the median of the last watched steps (host clock at
each step boundary, no device sync), so its blocks are scaled to the step as it had become. The run's
other figures (memory, FLOPs counted, energy) belong to the parent run and are not repeated here.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from lmprof.measure.profiling import ProfiledPhase
from lmprof.pipeline.protocol.finish.assemble import assemble
from lmprof.pipeline.protocol.finish.measured import Described, Measured
from lmprof.pipeline.protocol.observed import ModelFacts, Observed, model_facts
from lmprof.pipeline.protocol.plan import PhasePlan
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.timing import Timings
from lmprof.record.run import Run

STEP_MEANS = ("the median of the watched steps just before the capture: host clock from one optimizer step's end "
              "to the next's, no device sync (the whole-run watch's step_s)")


def capture_run(spec: Spec, plan: PhasePlan, seen: Observed, folder: Path, profile: ProfiledPhase,
                step_s: Sequence[float], config: dict[str, Any],
                per_step: tuple[float | None, float | None, float | None, float | None],
                describe: Callable[[ModelFacts], Described]) -> Run:
    """The captured window in ``folder`` as a Run, saved there (run.json, blocks.csv, ops.csv, the trace);
    ``step_s``: the watched steps before it (seconds), ``per_step``: backward and forward passes per
    captured step (and the distinct batches and their token ids), ``config``: what the watch says of the capture (merged into the driver's config)."""
    assert seen.device is not None
    facts = model_facts(seen)
    said = describe(facts)
    backwards, forwards, batches, tokens = per_step
    m = Measured(
        spec=dataclasses.replace(spec, report=False, plots=False, verbose=False, watch=None), plan=plan,
        folder=folder, device=seen.device, config={**said.config, **config}, step_means=STEP_MEANS,
        timings=Timings(steps=list(step_s)), profile=profile, notes=[], facts=facts, known=said.known,
        compiled=seen.compiled, input_shape=seen.input_shape, backwards_per_step=backwards, forwards_per_step=forwards,
        batches_per_step=batches, tokens_per_step=tokens,
        memory=None, cache_bytes=None, flops=None, recomputes=seen.recomputes, others=seen.others, shapes=None,
        energy=None, noise=None, compile=None,
        figure_notes=["a window captured by the whole-run watch: its memory measurement, FLOP count and energy "
                      "are the parent run's (one folder up)"])
    run = assemble(m)
    run.save(folder)
    return run
