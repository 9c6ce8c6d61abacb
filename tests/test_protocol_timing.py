"""One clock for every door: a training step from boundary to boundary, a generation from its start to
its end, its prefill to the end of the first forward, each decode step from one forward's end to the
next. Truth: a fake clock whose readings are written here, one per mark, in the order the protocol
reads them; no profiler runs (the plan keeps the session in warm-up and the clean window).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lmprof.pipeline.protocol.driver import Driver
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.timing import ROUGH, Generation, StepClock


class Loop(Driver):
    """A loop that reports its own forwards and needs no figures step (no recording runs)."""

    hooks_forwards = False
    raises = True

    def figures_at(self, warmup: int, compiled: bool) -> int:
        return 0

    def step_means(self) -> str:
        return "a test step"


def _session(tmp_path, mode: str, ticks: list[float], syncs: list[int]) -> Session:
    """Warm-up 1, then a clean window longer than the test drives: the profiler never starts."""
    clock = iter(ticks)
    session = Session(Spec(mode=mode, warmup=1, steps=3, profile_steps=1, run_dir=tmp_path / "r", energy="off",
                           report=False, verbose=False), Loop(), clock=lambda: next(clock))
    session.observed.sync = lambda: syncs.append(1)  # type: ignore[method-assign]  # counts the device syncs
    session.clock.sync = session.observed.sync
    session.attach(torch.nn.Linear(2, 2))
    return session


def test_a_generation_is_timed_from_its_start_to_its_end_with_every_forward_marked(tmp_path):
    # three generations (warm-up, then two clean), each: start, prefill end, two decode ends, end
    ticks = [0.0, 0.5, 0.6, 0.7, 0.8,
             1.0, 1.030, 1.040, 1.052, 1.060,
             2.0, 2.025, 2.036, 2.047, 2.050]
    syncs: list[int] = []
    session = _session(tmp_path, "infer", ticks, syncs)
    prompt = torch.zeros(4, 7, dtype=torch.long)
    for _ in range(3):
        session.generation_begin(None, (prompt,))
        for _ in range(3):
            session.forward_end()
        session.generation_end()
    measured = session.finish("the loop ended")
    assert measured is not None and len(syncs) == len(ticks)  # every mark with the device synchronized
    first, second = measured.timings.gens
    assert first.prefill_s == pytest.approx(0.030) and first.decode_s == pytest.approx([0.010, 0.012])
    assert first.e2e_s == pytest.approx(0.060)  # the whole generation, the loop's own work after its last forward too
    assert second.e2e_s == pytest.approx(0.050) and second.forwards == 3
    assert (first.batch, first.prompt_len) == (4, 7)
    assert measured.timings.rough_gens["first"][0].e2e_s == pytest.approx(0.8)


def test_throughputs_of_generations_from_their_times_by_hand():
    """Prefill, decode and output (every generated token over the whole generation) tokens/s: the median
    over the clean generations of each one's own ratio, computed here from the times written by hand."""
    from types import SimpleNamespace

    from lmprof.pipeline.protocol.finish.assemble import _infer_metrics
    from lmprof.pipeline.protocol.timing import Timings

    t = Timings()
    for e2e, decode in ((0.060, [0.010, 0.012]), (0.050, [0.011, 0.011]), (0.040, [0.008, 0.010])):
        t.keep(Generation(prefill_s=0.030, decode_s=decode, e2e_s=e2e, batch=4, prompt_len=7, forwards=3), None)
    m = SimpleNamespace(timings=t, config={}, spec=Spec(mode="infer"), hooked_forwards=False)
    metrics = _infer_metrics(m, None, [])  # type: ignore[arg-type]  # only what the timing figures read
    out = metrics["output_tokens_per_s"]
    assert (out.value, out.p10, out.n) == (pytest.approx(4 * 3 / 0.050), pytest.approx(np.percentile(
        [4 * 3 / 0.060, 4 * 3 / 0.050, 4 * 3 / 0.040], 10)), 3)
    assert out.unit == "tokens/s" and out.source == "derived"
    assert metrics["decode_tokens_per_s"].value == pytest.approx(4 * 2 / 0.022)  # the other ratios, as before
    assert metrics["prefill_tokens_per_s"].value == pytest.approx(4 * 7 / 0.030)
    # total: the 4 prompts' 7 tokens once and the 4 x 3 generated, over the whole generation (vLLM's total tokens/s)
    total = metrics["total_tokens_per_s"]
    assert (total.value, total.n, total.unit) == (pytest.approx((4 * 7 + 4 * 3) / 0.050), 3, "tokens/s")
    assert metrics["e2e_latency"].value == pytest.approx(50.0) and m.config == {"new_tokens": 3}


def test_training_steps_are_timed_boundary_to_boundary_and_warm_up_steps_kept_apart(tmp_path):
    # begin (step 1, warm-up), its end; step 2's start (the clean window opens), then at each boundary the
    # step's end and, after lmprof's own work there, the next one's start
    ticks = [0.0, 0.4, 0.41, 0.51, 0.515, 0.635, 0.64]
    syncs: list[int] = []
    session = _session(tmp_path, "train", ticks, syncs)
    session.begin()
    for _ in range(3):
        session.boundary()
    measured = session.finish("the loop ended")
    assert measured is not None
    assert measured.timings.steps == pytest.approx([0.10, 0.12])  # the boundary's own work (0.005) in neither
    assert measured.timings.rough_steps == {"first": [pytest.approx(0.4)]}


def test_step_clock_marks_and_builds_generations_from_its_marks():
    ticks = iter([1.0, 1.2, 1.5, 2.0])
    syncs: list[int] = []
    clock = StepClock(lambda: next(ticks), lambda: syncs.append(1))
    clock.restart()
    clock.generation_begins(torch.zeros(2, 3, dtype=torch.long))
    assert clock.forward_ends(None) and clock.forward_ends(None)
    gen, shape = clock.generation_ends(None)
    assert gen == Generation(prefill_s=pytest.approx(0.2), decode_s=[pytest.approx(0.3)], e2e_s=1.0, batch=2,
                             prompt_len=3, forwards=2)
    assert shape == (2, 3) and len(syncs) == 4
    assert not clock.forward_ends(None)  # no generation runs


def test_rough_timings_are_used_best_first_and_said_so():
    from lmprof.pipeline.protocol.plan import PhasePlan
    from lmprof.pipeline.protocol.timing import Timings

    t = Timings()
    t.keep(0.9, "first")
    t.keep(0.3, "warm-up")
    note = t.fall_back("step", PhasePlan.of(3, 10, 3, figures_at=2, flops_apart=True))
    assert t.steps == [0.3] and t.first_call == "warm-up" and list(ROUGH).index("warm-up") < list(ROUGH).index("first")
    assert note is not None and note.startswith("first call: includes warm-up costs") and "at least 17 steps" in note
