"""Steps that grow (or shrink) steadily are a trend, said as one, not noise blamed on something else.

Truth: sequences written here by hand (a line with a known slope, the same values shuffled) and, end to
end, a loop whose every step sleeps a known, growing time, timed by the script's own stopwatch.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from lmprof.analysis.noise import SPREAD_LIMIT, ProfiledWindow, spread_reason, window_reasons
from lmprof.analysis.step_trend import steady_trend

LINE = [7.0 + 1.2 * i for i in range(10)]  # 7.0 ... 17.8 ms: p90/p10 ~2.2x, far beyond the spread limit
JITTER = [1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.98, 1.01]
RISING = [x * j for x, j in zip(LINE, JITTER)]


def test_a_line_with_jitter_is_a_trend_with_its_slope() -> None:
    trend = steady_trend(RISING, SPREAD_LIMIT)
    assert trend is not None and trend.slope_ms == pytest.approx(1.2, abs=0.1)
    assert trend.at(0) == pytest.approx(7.0, rel=0.05) and trend.at(9) == pytest.approx(17.8, rel=0.05)
    falling = steady_trend(RISING[::-1], SPREAD_LIMIT)
    assert falling is not None and falling.slope_ms == pytest.approx(-1.2, abs=0.1)


def test_one_disturbed_step_does_not_tilt_the_line() -> None:
    spiked = list(RISING)
    spiked[4] *= 1.6
    trend = steady_trend(spiked, SPREAD_LIMIT)
    # the steps still keep to a line but one: the spike leaves them scattered beyond a steady run's spread
    assert trend is None or trend.slope_ms == pytest.approx(1.2, abs=0.15)


def test_the_same_times_in_no_order_are_no_trend() -> None:
    shuffled = list(RISING)
    random.Random(3).shuffle(shuffled)
    assert steady_trend(shuffled, SPREAD_LIMIT) is None
    assert "vary" in (spread_reason(shuffled, "step") or "")
    assert steady_trend(RISING[:5], SPREAD_LIMIT) is None  # too few to tell an order from chance


def test_a_trend_is_said_as_one_and_the_profiled_steps_are_judged_where_it_leads() -> None:
    reason = spread_reason(RISING, "step") or ""
    assert "grew steadily" in reason and "from 7" in reason and "vary 2" not in reason
    # the profiled steps come after the 10 clean ones and the profiler's own warm-up step: 11, 12, 13
    cost = 0.5
    led = [7.0 + 1.2 * i + cost for i in (11, 12, 13)]
    assert window_reasons(RISING, "step", ProfiledWindow(led, cost)) == []
    disturbed = [led[0], led[1] * 1.8, led[2]]
    (said,) = window_reasons(RISING, "step", ProfiledWindow(disturbed, cost))
    assert said.startswith("profiled step 2 (") and "trend leads" in said


LOOP = """
import json, sys, time
import torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
for i in range(18):
    t = time.perf_counter()
    model(torch.randn(2, 4)).sum().backward()
    time.sleep(0.004 + 0.0015 * i)  # the step's own work grows by 1.5 ms a step
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t)
json.dump(times, open(sys.argv[1], "w"))
"""


@pytest.mark.stopwatch  # the loop's sleeps are its truth: on a machine busy with other tests they overshoot
def test_lmprof_run_says_the_steps_grew_by_what_the_scripts_own_stopwatch_saw(run_script) -> None:
    done = run_script(LOOP)
    assert done.code == 0, done.err
    reasons = done.record["noise"]
    # the growth as the script's own stopwatch saw it, step to step (the median: lmprof's first steps and the
    # profiled ones cost more, on top of the loop's own)
    truth = float(np.median(np.diff(done.own))) * 1e3
    assert truth == pytest.approx(1.5, abs=0.3)
    said = [r for r in reasons if "grew steadily" in r]
    assert said, reasons
    slope = float(said[0].split("(")[1].split(" ms a step")[0])
    assert slope == pytest.approx(truth, rel=0.2)
    assert not any("something else ran" in r for r in reasons), reasons


def test_a_falling_trend_that_leads_below_zero_judges_by_the_median() -> None:
    falling = [20.0 - 2.5 * i for i in range(8)]  # 20 ... 2.5 ms: the line reaches 0 by the profiled steps
    assert steady_trend(falling, SPREAD_LIMIT) is not None
    said = window_reasons(falling, "step", ProfiledWindow([11.0, 11.0, 11.0], 0.5))
    assert all("trend leads" not in r for r in said)
