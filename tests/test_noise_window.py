"""The profiled window against the clean steps' own spread: a disturbed profiled step is flagged and
named, a quiet run is not, and the operator table is the per-operator median over the profiled steps.

Hand-built figures for the rules; real tiny runs whose profiled window is disturbed by the test
itself (a sleep and a burst of extra operators in one profiled step) for the end-to-end checks.
"""
from __future__ import annotations

import re

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lmprof.analysis.noise import (
    ProfiledWindow,
    block_outliers,
    fast_limit_ms,
    slow_limit_ms,
    window_reasons,
)
from lmprof.record.run import Run
from lmprof.trace.attribution import Attribution, Repeats

CLEAN = [10.0, 10.2, 9.9, 10.1, 10.4, 9.8, 10.0, 10.3, 10.1, 10.0]  # median 10.05, slowest 10.4, fastest 9.8


def test_limits_by_hand() -> None:
    # slow: 10.05 + 1.5 x 1.0 cost + max(2 x (10.4 - 10.05), 0.5 x 10.05) = 10.05 + 1.5 + 5.025
    assert slow_limit_ms(CLEAN, 1.0) == pytest.approx(16.575)
    # a long clean tail widens it: slowest 30 (median now 10.1) -> 2 x (30 - 10.1) beyond the median
    assert slow_limit_ms([*CLEAN[:-1], 30.0], 0.0) == pytest.approx(10.1 + 2 * (30 - 10.1))
    # cost not measured (device clock): one clean median on top
    assert slow_limit_ms(CLEAN, None) == pytest.approx(20.1)
    # fast: below both the fastest clean step minus the lower spread, 9.8 - (10.05 - 9.8) = 9.55,
    # and 5% under the median, 10.05 x 0.95 = 9.5475
    assert fast_limit_ms(CLEAN) == pytest.approx(9.5475)


def test_one_slow_profiled_step_is_named_with_how_much_slower() -> None:
    reasons = window_reasons(CLEAN, "step", ProfiledWindow([11.0, 33.0, 11.2], cost_ms=1.0))
    assert len(reasons) == 1
    # 33 / (10.05 + 1.0) = 2.99x
    assert "profiled step 2 (33 ms, 2.99x) of 3" in reasons[0]
    assert "median profiled step" in reasons[0]


def test_whole_window_slow_is_named_as_the_window() -> None:
    reasons = window_reasons(CLEAN, "generation", ProfiledWindow([80.0], cost_ms=1.0))
    assert len(reasons) == 1 and reasons[0].startswith("the profiled window (1 generation, median 80 ms) ran 7.24x")


def test_profiler_cost_explains_a_slower_window() -> None:
    # 25 ms profiled against a 10 ms clean step is fine when the profiler's measured cost is 14 ms.
    assert window_reasons(CLEAN, "step", ProfiledWindow([25.0, 25.5, 24.8], cost_ms=14.0)) == []
    assert window_reasons(CLEAN, "step", ProfiledWindow([25.0, 25.5, 24.8], cost_ms=1.0))


@pytest.mark.parametrize("pct_faster", [2.2, 2.6, 3.1])
def test_slightly_faster_window_within_the_spread_is_not_flagged(pct_faster: float) -> None:
    # The quiet runs: a profiled phase 2.2-3.1% faster than the clean one, inside p10-p90.
    fast = 10.05 * (1 - pct_faster / 100)
    assert window_reasons(CLEAN, "step", ProfiledWindow([fast] * 3, cost_ms=0.3)) == []


def test_clearly_faster_window_is_flagged() -> None:
    reasons = window_reasons(CLEAN, "step", ProfiledWindow([8.0, 8.1, 7.9], cost_ms=0.3))
    assert len(reasons) == 1 and "20.4% faster" in reasons[0]


def test_single_step_block_outlier_by_hand() -> None:
    # One profiled step of 10 ms; ln_1 backward's 12 node calls: median 0.05 ms, one took 1.8 ms.
    att = Attribution(1, [10_000.0], [], "cpu", repeats=[
        Repeats("ln_1", "backward", "autograd::engine::evaluate_function: NativeLayerNormBackward0", 0, 12, 50.0, 1800.0),
        Repeats("mlp.fc", "forward", "lmprof:mlp.fc", 0, 12, 100.0, 350.0),  # 3.5x: below the factor of 4
        Repeats("ln_2", "forward", "lmprof:ln_2", 0, 12, 10.0, 200.0),  # 20x, but only 1.9% of the step
    ])
    out = block_outliers(att)
    assert [(o["block"], o["phase"], o["calls"]) for o in out] == [("ln_1", "backward", 12)]
    assert out[0]["step_share_pct"] == pytest.approx(18.0)
    reasons = window_reasons(CLEAN, "step", ProfiledWindow([10.5], cost_ms=0.2, outliers=out))
    assert reasons == ["ln_1 (backward): one of its 12 autograd::engine::evaluate_function: NativeLayerNormBackward0 "
                       "calls in profiled step 1 took 1.8 ms against a median 0.05 ms per call (18.0% of the step): "
                       "a disturbance inside the profiled window, so this block's time is uncertain"]
    # Three profiled steps: the block medians reject a disturbed step, so no instance is flagged.
    att.steps, att.step_us = 3, [10_000.0] * 3
    assert block_outliers(att) == []


@dataclass
class _Range:
    start: float
    end: float


@dataclass
class _Event:
    """The fields of torch's FunctionEvent that the operator table reads."""

    name: str
    start: float
    self_cpu_time_total: float
    cpu_time_total: float
    device_type: str = "CPU"
    self_device_time_total: float = 0.0
    dur: float = 1.0

    @property
    def key(self) -> str:
        return self.name

    @property
    def time_range(self) -> _Range:
        return _Range(self.start, self.start + self.dur)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _loop(out: Path, disturb_at: int | None) -> Run:
    """A tiny training loop under lmprof.profile (2 warm-up, 12 clean, 1 profiler warm-up, 3 profiled
    steps: loop indices 15-17 are the profiled ones); step ``disturb_at`` also sleeps and runs 300
    extra torch.cat, sized from the slowest step so far so it stands out on a loaded machine too."""
    import lmprof

    torch.manual_seed(0)
    model = _Mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # about 6 ms a step: the slow limit's margin (half a clean median) then stays above the
    # millisecond a shared VM's scheduler can take from any one step (at 0.7 ms a quiet run was
    # flagged for a 2.2 ms profiled step)
    x = torch.randn(2048, 64)
    slowest = 0.0
    with lmprof.profile(model, out=out, warmup=2, steps=12, profile_steps=3, report=False, verbose=False) as prof:
        for i in range(20):
            t = time.perf_counter()
            model(x).pow(2).mean().backward()
            if i == disturb_at:
                time.sleep(max(0.05, 8 * slowest))
                for _ in range(300):
                    torch.cat([x, x, x])
            opt.step()
            opt.zero_grad()
            prof.step()
            slowest = max(slowest, time.perf_counter() - t)
    assert prof.folder is not None
    return Run.load(prof.folder)


@pytest.fixture()
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on a shared 2-core machine turn every step into lock contention
    yield
    torch.set_num_threads(before)


def test_disturbed_profiled_step_is_flagged_and_named(tmp_path: Path, one_thread: object) -> None:
    run = _loop(tmp_path, disturb_at=16)
    assert run.noisy
    named = [r for r in run.noise if r.startswith("profiled step")]
    assert len(named) == 1 and "x) of 3" in named[0], run.noise
    # Step 2 is named, the most slowed; a loaded machine may push another just over the limit too
    # (CI: "profiled step 1 (8.93 ms, 1.51x), 2 (105 ms, 17.71x) of 3", the limit 8.86 ms).
    ratios = {int(n): float(r) for n, r in re.findall(r"(\d+) \([^,()]+, ([\d.]+)x\)", named[0])}
    assert 2 in ratios and max(ratios, key=lambda k: ratios[k]) == 2 and ratios[2] > 3, named[0]
    # The operator table is the median profiled step: the burst of torch.cat does not reach it.
    cat = [o for o in run.ops if o.name == "aten::cat"]
    assert not cat or cat[0].calls < 300


@pytest.mark.stopwatch  # a quiet run needs a quiet machine: not beside another test worker
def test_quiet_runs_have_no_window_flags(tmp_path: Path, one_thread: object) -> None:
    # What must never appear on an undisturbed window is a profiled-window reason: the decision is
    # relative to the run's own spread. A shared VM cannot promise an undisturbed window: a burst of
    # load can land in the profiled steps alone (it did, to 2 of 3 profiled steps, once). Runs whose
    # clean steps spread, or whose machine was loaded, are set aside (not quiet by lmprof's other
    # measures); of the steady ones, fewer than three may come out flagged, and one at least not. A
    # profiler cost the rule failed to allow for would flag every steady run, and fail this.
    clean, flagged, noisy = 0, [], []
    for k in range(10):
        run = _loop(tmp_path / str(k), disturb_at=None)
        window = [r for r in run.noise if "profiled" in r]
        if len(window) < len(run.noise):  # the clean steps' spread or the machine's load said so
            noisy.append(run.noise)
        elif window:
            flagged.append(window)
            assert len(flagged) < 3, flagged
        else:
            clean += 1
            if clean == 3:
                return
    if not clean:
        pytest.skip(f"no steady run in 10 on this machine ({len(flagged)} flagged): {noisy}")


class _Sleepy(torch.nn.Module):
    """Wraps a module; sleeps inside its call while ``on``."""

    def __init__(self, inner: torch.nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner, self.seconds, self.on = inner, seconds, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on:
            time.sleep(self.seconds)
        return self.inner(x)


@pytest.mark.stopwatch  # judged from one profiled step's timings: run alone, as the stopwatch tests are
def test_single_profiled_step_block_outlier_is_flagged(tmp_path: Path, one_thread: object) -> None:
    """One profiled step (a sweep's setting): one layer's ln_1 sleeps in it; the run names ln_1.

    Up to 3 rounds: a round whose profiled step a shared machine disturbed elsewhere is run again."""
    import lmprof
    from lmprof.workloads.gpt import GPT, preset

    seen: list[object] = []
    for round_ in range(3):
        torch.manual_seed(0)
        model = GPT(preset("tiny"))
        sleepy = _Sleepy(model.transformer.h[2].ln_1, 0.3)
        model.transformer.h[2].ln_1 = sleepy
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randint(0, 65, (2, 16))
        # 1 warm-up, 4 clean, 1 profiler warm-up, then the profiled step: loop index 6
        with lmprof.profile(model, out=tmp_path / str(round_), warmup=1, steps=4, profile_steps=1, report=False,
                            verbose=False) as prof:
            for i in range(8):
                sleepy.on = i == 6
                model(x, x)[1].backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        run = Run.load(prof.folder)
        outliers = run.tables["attribution"][0]["outliers"]
        seen.append(outliers)
        if any(o["block"] == "ln_1" and o["phase"] == "forward" and o["calls"] == 4 for o in outliers):
            assert any(r.startswith("ln_1 (forward): one of its 4") for r in run.noise), run.noise
            return
    raise AssertionError(f"ln_1 never flagged in 3 rounds: {seen}")