"""Noise detection and the per-event correction, against figures worked out by hand."""
from __future__ import annotations

import json

import pytest

from lmprof.analysis.noise import ProfiledWindow, load_reason, noise_reasons, spread_reason
from lmprof.analysis.reconcile import event_overhead_us, reconcile
from lmprof.measure.noise import Snapshot, other_cores
from lmprof.measure.profiler_cost import EventCost
from lmprof.trace.attribution import Attribution, EventCounts, Part, attribute
from lmprof.trace.load import load_trace


def snap(wall, busy, own, cpus=2, threads=1, load=None):
    return Snapshot(wall_s=wall, machine_busy_s=busy, own_cpu_s=own, loadavg_1m=load, threads=threads, cpus=cpus)


def test_other_cores_is_machine_busy_minus_own_over_wall():
    # 10 s of wall; the machine was busy 15 CPU-s, of which this process used 9: others kept 0.6 cores busy.
    assert other_cores(snap(0, 100, 50), snap(10, 115, 59)) == pytest.approx(0.6)


def test_quiet_and_loaded_windows():
    assert load_reason(snap(0, 100, 50), snap(10, 110.5, 60), "cpu") is None  # others 0.05 cores
    reason = load_reason(snap(0, 100, 50), snap(10, 118, 60), "cpu")  # others 0.8 cores of the 1 left free
    assert reason and "0.80 +- 0.00 of 2 cores" in reason


def test_spread_rule():
    assert spread_reason([10.0] * 9 + [10.5], "step") is None
    assert "vary" in spread_reason([10, 10, 10, 10, 20, 20, 20, 20, 20, 20], "step")


def test_noise_reasons_collects_every_rule():
    # spread, load, and a profiled window far faster than the clean steps' fastest (10 ms)
    reasons = noise_reasons([10, 30, 10, 30, 10], "step", snap(0, 100, 50), snap(10, 118, 60), "cpu",
                            ProfiledWindow([5.0, 5.0, 5.0], cost_ms=0.1))
    assert len(reasons) == 3


COST = EventCost(op_us=1.0, scope_us=4.0, scope_inside_us=3.0, op_spread_us=0, scope_spread_us=0, repeats=1)


def test_event_overhead_by_hand():
    counts = EventCounts(ops=10, scopes=2, op_ranges=1, child_scopes=3, child_op_ranges=4)
    # 10 ops x 1 + 2 own scopes x 3 inside + 3 child scopes x 1 outside + 1 own op range x 1 x 3/4 + 4 x 1 x 1/4
    assert event_overhead_us(counts, COST) == pytest.approx(10 + 6 + 3 + 0.75 + 1)


def test_reconcile_subtracts_then_scales_to_the_clean_step():
    steps = [{("a", "forward"): 100.0, ("b", "forward"): 50.0}, {("a", "forward"): 110.0, ("b", "forward"): 50.0}]
    att = Attribution(2, [150.0, 160.0], [Part("a", "forward", 105, 1), Part("b", "forward", 50, 1)], "cpu",
                      per_step=steps, events={("b", "forward"): EventCounts(ops=20)})
    rec = reconcile(att, clean_ms=0.135, cost=COST)
    got = {b.name: b.time_ms for b in rec.blocks}
    # a: median 105; b: 50 - 20 x 1 = 30; sum 135 us = the clean step, so the scale is 1.
    assert got == pytest.approx({"a": 0.105, "b": 0.030})
    assert rec.scale == pytest.approx(1.0)
    assert "subtracted" in rec.correction


def test_device_clock_is_not_corrected():
    att = Attribution(1, [100.0], [Part("k", "forward", 60, 1), Part("idle", "step", 40, 0)], "device",
                      per_step=[{("k", "forward"): 60.0, ("idle", "step"): 40.0}],
                      events={("k", "forward"): EventCounts(ops=50)})
    rec = reconcile(att, clean_ms=0.2, cost=COST)
    assert {b.name: b.time_ms for b in rec.blocks} == pytest.approx({"k": 0.12, "idle": 0.08})
    assert rec.correction.startswith("none: device clock")


def test_a_block_of_one_profiled_step_in_three_is_a_note_not_a_row_of_nothing():
    """An evaluation's generate() in one of three profiled steps: its median is 0, and it was a row of 0.000 ms."""
    steps = [{("mlp", "forward"): 100.0}, {("mlp", "forward"): 104.0},
             {("mlp", "forward"): 102.0, ("generate", "step"): 10_600.0}]
    parts = [Part("mlp", "forward", 102, 1), Part("generate", "step", 10_600 / 3, 1 / 3)]
    rec = reconcile(Attribution(3, [100.0, 104.0, 10_702.0], parts, "cpu", per_step=steps), clean_ms=0.1, cost=None)
    assert [(b.name, b.phase) for b in rec.blocks] == [("mlp", "forward")]
    assert rec.blocks[0].time_ms == pytest.approx(0.1)
    assert ("ran in fewer than half of the 3 profiled steps, so in no row (each row is the median step's): "
            "generate (step): 10.6 ms (profiled) in step 3") in rec.notes


def test_an_other_row_of_a_tenth_or_more_names_its_operators():
    """other (step) holds 30 of a 100 us step, 12 us of it in operators called directly in it: the note gives its
    share, that share and the operators; other (forward) at 5% gets none."""
    parts = [Part("mlp", "forward", 65, 1), Part("other", "forward", 5, 1), Part("other", "step", 30, 1)]
    att = Attribution(1, [100.0], parts, "cpu", per_step=[{(p.name, p.phase): p.us for p in parts}],
                      other_ops={("other", "step"): (12.0, [("aten::_foreach_lerp_", 9.0), ("aten::randn", 3.0)]),
                                 ("other", "forward"): (5.0, [("aten::add", 5.0)])})
    notes = [n for n in reconcile(att, clean_ms=0.1, cost=None).notes if n.startswith("other")]
    assert notes == ["other (step) is 30% of the profiled step: the loop's own work between the model's phases "
                     "(outside its forward and backward, the optimizer and zero_grad: an EMA update, metrics, "
                     "logging). Operators called directly in it take 40% of its profiled time (the rest is Python "
                     "between them); the largest, profiled time a step: aten::_foreach_lerp_ (0.009 ms), "
                     "aten::randn (0.003 ms)"]


def X(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def test_event_counts_from_a_trace_written_by_hand(tmp_path):
    events = [
        X("ProfilerStep#1", 0, 100, cat="user_annotation"),
        X("lmprof:forward", 10, 60, cat="user_annotation"),
        X("lmprof:ln_1", 12, 10, cat="user_annotation"),
        X("aten::layer_norm", 13, 8), X("aten::native_layer_norm", 14, 6),
        X("lmprof:residual", 30, 5, cat="user_annotation"),
        X("aten::add", 31, 3),
        X("aten::empty", 40, 1),  # in forward, outside any block
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    att = attribute(load_trace(path), clock="cpu")
    ln, res, fwd = att.events[("ln_1", "forward")], att.events[("residual", "forward")], att.events[("other", "forward")]
    assert (ln.ops, ln.scopes, ln.child_scopes) == (2, 1, 0)
    assert (res.ops, res.scopes) == (1, 1)
    assert (fwd.ops, fwd.scopes, fwd.child_scopes) == (1, 1, 2)


def test_first_steps_still_warming_are_a_note_not_noise():
    """Leading clean steps slower than a steady rest (a quiet run of 1 ms steps after 2 warm-up steps, as
    the script's own stopwatch read them): warming up, said with the figures; the run is not noisy."""
    from lmprof.analysis.noise import warming_note, warming_steps

    quiet = [1.57, 1.19, 1.0, 0.97, 0.96, 1.24, 0.96, 1.01, 0.95, 1.01]
    assert warming_steps(quiet) == 2 and spread_reason(quiet, "step") is None
    note = warming_note(quiet, "step")
    assert note.startswith("the first 2 of 10 clean steps (1.57, 1.19 ms) ran slower than the rest (median 0.985 ms")
    assert "the step median of all 10 is 1.00 ms; 2 more warm-up steps would leave them out" in note
    # steady as they are: nothing to say
    assert warming_steps([1.0] * 9 + [1.1]) == 0 and warming_note([1.0] * 9 + [1.1], "step") is None
    # a slow step in the middle, or slow steps that are a majority, are not warming: noise as before
    middle = [1.0, 1.0, 1.0, 1.6, 1.6, 1.0, 1.0, 1.0, 1.6, 1.0]
    assert warming_steps(middle) == 0 and "vary" in spread_reason(middle, "step")
    most = [2.0] * 6 + [1.0] * 4
    assert warming_steps(most) == 0 and "vary" in spread_reason(most, "step")
    # the rest still spread: noise, judged on the rest
    assert warming_steps([3.0, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0]) == 0


def test_noise_reasons_judge_the_profiled_window_against_the_steady_rest():
    """A warming step's time is not the clean steps' own spread: a profiled step beyond the steady rest's
    limit is named even when a warming step was as slow."""
    clean = [3.0, 2.5, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0]
    window = ProfiledWindow([2.9, 2.9, 2.9], cost_ms=0.1)
    reasons = noise_reasons(clean, "step", snap(0, 100, 50), snap(0.01, 100.01, 50.01), "cpu", window)
    assert len(reasons) == 1 and reasons[0].startswith("the profiled window (3 steps, median 2.9 ms)")
