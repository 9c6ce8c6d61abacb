"""The phase plan: which phase each step is in, and the boundaries that open and close the windows.

Truth: the protocol written out by hand, step by step, for the counts docs/user-code.md names.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lmprof.pipeline.protocol.plan import Phase, PhasePlan

W, G, C, PW, P, D = (Phase.WARMUP, Phase.GAP, Phase.CLEAN, Phase.PROFILER_WARMUP, Phase.PROFILED, Phase.DONE)


def phases(plan: PhasePlan, upto: int) -> list[Phase]:
    return [plan.phase_of(n) for n in range(1, upto + 1)]


def test_the_default_training_protocol_step_by_step():
    """--warmup 3 --steps 10 --profile-steps 3: 17 steps, the figures step the second, FLOPs on the third."""
    plan = PhasePlan.of(3, 10, 3, figures_at=2, flops_apart=True)
    assert phases(plan, 18) == [W] * 3 + [C] * 10 + [PW] + [P] * 3 + [D]
    assert plan.needed == 17 and (plan.figures_at, plan.flops_at) == (2, 3) and plan.flops_apart
    assert [plan.profiled_index(n) for n in (14, 15, 17)] == [0, 1, 3]
    assert [n for n in range(1, 19) if plan.warmup_ends(n)] == [4]
    assert [n for n in range(1, 19) if plan.clean_begins(n)] == [4]
    assert [n for n in range(1, 19) if plan.clean_ends(n)] == [13]
    assert [n for n in range(1, 19) if plan.window_starts(n)] == [14]
    assert [n for n in range(1, 19) if plan.window_completes(n)] == [17]


def test_steps_zero_puts_one_untimed_step_between_warm_up_and_the_profiler():
    plan = PhasePlan.of(1, 0, 1, figures_at=1, flops_apart=True)
    assert phases(plan, 5) == [W, G, PW, P, D]
    assert plan.gap == 1 and plan.needed == 4 and not any(plan.timed(n) for n in range(1, 6))
    assert not any(plan.clean_begins(n) for n in range(1, 6))  # no clean window: no meter, no noise counters
    assert [n for n in range(1, 6) if plan.clean_ends(n)] == [2]  # the gap step closes what the clean window would


def test_flops_are_counted_apart_only_when_a_warm_up_step_follows_the_figures_step():
    assert PhasePlan.of(2, 5, 1, figures_at=2, flops_apart=True).flops_at == 2  # the figures step is the last
    assert PhasePlan.of(3, 5, 1, figures_at=2, flops_apart=False).flops_at == 2  # inference, lmprof's own loop
    assert PhasePlan.of(0, 5, 1, figures_at=2, flops_apart=True).figures_at == 0  # no warm-up: no figures step


def test_a_longer_clean_window_moves_the_profiled_window():
    plan = PhasePlan.of(2, 3, 1, figures_at=2, flops_apart=False).with_steps(5)
    assert phases(plan, 9) == [W] * 2 + [C] * 5 + [PW, P]


@given(st.integers(0, 6), st.integers(0, 12), st.integers(1, 5))
def test_every_step_has_one_phase_and_the_phases_come_in_order(w, s, p):
    plan = PhasePlan.of(w, s, p, figures_at=2, flops_apart=True)
    seen = phases(plan, plan.needed + 2)
    order = [W, G, C, PW, P, D]
    assert [order.index(x) for x in seen] == sorted(order.index(x) for x in seen)
    gap = 1 if s == 0 and w in (1, 2) else 0  # the figures step (the second warm-up step, or the only) is the last
    assert seen.count(W) == w and seen.count(C) == s and seen.count(G) == gap
    assert seen.count(PW) == 1 and seen.count(P) == p and plan.needed == w + s + gap + 1 + p
    assert plan.layout("step").startswith(f"{plan.needed} steps: ")


def test_no_gap_without_a_figures_step_right_before_the_profiler():
    """--warmup 0 --steps 0 --profile-steps 1: no figures step records, so no step is spent between it and the
    profiler: two generations are the profiler's warm-up and the profiled one (issue 49 item 9)."""
    plan = PhasePlan.of(0, 0, 1, figures_at=2, flops_apart=False)
    assert phases(plan, 3) == [PW, P, D] and plan.needed == 2
    assert plan.layout("generation") == "2 generations: 1 for the profiler's own warm-up, 1 profiled"
    assert phases(PhasePlan.of(3, 0, 1, figures_at=2, flops_apart=True), 5) == [W, W, W, PW, P]  # FLOPs step between
    assert not any(plan.clean_begins(n) for n in range(1, 4))  # no clean window: no meter
