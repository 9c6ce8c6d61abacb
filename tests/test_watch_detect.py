"""The watch's detectors on series whose truth the test injected: each alert where it was put, with its
figures; none on noise, including any series that stays inside the clean steps' own spread."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmprof.analysis.noise import FAST_MIN_SHARE, step_slow_limit_ms, window_slow_limit_ms
from lmprof.analysis.watch_detect import Rules, WatchAnalyzer, analyze_series, stragglers, theil_sen
from lmprof.record.run import Baseline

FIRST = 1000  # the first watched step's index (after warm-up, clean and profiled steps)
MS = 1e-3


def series(step_s, **cols) -> dict[str, np.ndarray]:
    n = len(step_s)
    rows = {"step": np.arange(FIRST, FIRST + n), "step_s": np.asarray(step_s, dtype=float), "own_s": np.zeros(n)}
    for k in ("device_s", "input_wait_s", "input_stall_s", "tokens", "loss", "mem_allocated_B", "mem_reserved_B",
              "rss_B"):
        rows[k] = np.full(n, np.nan)
    rows.update({k: np.asarray(v, dtype=float) for k, v in cols.items()})
    return rows


def jitter(rng, n, step=10 * MS, sigma=0.03):
    """Step times as a busy machine gives them: lognormal jitter and a 1.25x hiccup (GC) every ~50 steps."""
    x = step * rng.lognormal(0.0, sigma, n)
    x[rng.random(n) < 0.02] *= 1.25
    return x


def clean_baseline(rng, n=10, **figures) -> Baseline:
    return Baseline.from_samples(10 * MS * rng.lognormal(0.0, 0.03, n), **figures)


def first_raised(rows, baseline, kind, batch=1):
    """Feed rows ``batch`` at a time; the last step fed when an alert of ``kind`` first came out."""
    an, raised = WatchAnalyzer(baseline), None
    for a in range(0, len(rows["step"]), batch):
        new = an.feed({k: v[a:a + batch] for k, v in rows.items()})
        if raised is None and any(x.kind == kind for x in new):
            raised = int(rows["step"][min(a + batch, len(rows["step"])) - 1])
    return raised, an


def test_a_3x_slowdown_at_step_k_is_a_drift_from_k_raised_within_half_a_window():
    rng = np.random.default_rng(1)
    base = clean_baseline(rng)
    x = jitter(rng, 400)
    k = 250
    x[k:] *= 3  # the extra matmul from step K on
    raised, an = first_raised(series(x), base, "drift")
    alerts = an.finish()
    drift = [a for a in alerts if a.kind == "drift"]
    assert len(drift) == 1 and [a.kind for a in alerts] == ["drift"]  # the onset is no spike
    a = drift[0]
    assert abs(a.first_step - (FIRST + k)) <= 2
    assert raised is not None and raised <= FIRST + k + Rules().window // 2 + 1
    assert a.ongoing and a.last_step == FIRST + 399
    assert a.evidence["slowdown"].value == pytest.approx(3.0, rel=0.06) and a.evidence["slowdown"].unit == "x"
    assert a.evidence["baseline_step"].unit == "ms" and a.evidence["limit"].source == "derived"
    limit = window_slow_limit_ms(base.step_s_median * 1e3, base.step_s_spread * 1e3)
    assert a.evidence["limit"].value == pytest.approx(limit)


def test_a_slowdown_that_ends_closes_its_alert():
    rng = np.random.default_rng(2)
    x = jitter(rng, 300)
    x[100:160] *= 2
    alerts, _ = analyze_series(series(x), clean_baseline(rng))
    (a,) = alerts
    assert a.kind == "drift" and not a.ongoing
    assert abs(a.first_step - (FIRST + 100)) <= 2 and abs(a.last_step - (FIRST + 159)) <= Rules().window // 2 + 1


def test_memory_growing_a_fixed_amount_per_step_is_creep_at_that_rate():
    rng = np.random.default_rng(3)
    rate = 1.5 * 2**20  # 1.5 MiB a step: a list that keeps each step's activations
    mem = 3e9 + rate * np.arange(400) + rng.normal(0, 256 * 1024, 400)
    raised, an = first_raised(series(jitter(rng, 400), mem_allocated_B=mem), clean_baseline(rng, memory_bytes=3e9,
                              memory_capacity_bytes=80e9), "memory_creep", batch=8)
    (a,) = an.finish()
    assert a.kind == "memory_creep" and a.ongoing
    assert a.evidence["rate"].value == pytest.approx(rate, rel=0.10) and a.evidence["rate"].unit == "B/step"
    assert a.evidence["steps_to_full"].value == pytest.approx((80e9 - mem[-1]) / rate, rel=0.10)
    assert raised is not None and raised <= FIRST + 200  # the first full window of samples gives it
    assert a.first_step >= FIRST and a.last_step == FIRST + 399


@pytest.mark.parametrize("every", [3, 8, 40])
def test_memory_read_every_few_steps_still_gives_creep_at_its_rate_as_soon(every):
    """The watch reads memory every N steps when a read is dear: a fit still spans ~creep_window steps (at
    least creep_min_samples samples), so the rate is the same and it is raised about as early."""
    rng = np.random.default_rng(5)
    n, rate = 1200, 2**20
    mem = np.full(n, np.nan)
    mem[::every] = 3e9 + rate * np.arange(0, n, every) + rng.normal(0, 256 * 1024, len(mem[::every]))
    raised, an = first_raised(series(jitter(rng, n), mem_allocated_B=mem), clean_baseline(rng, memory_bytes=3e9),
                              "memory_creep", batch=8)
    (a,) = an.finish()
    assert a.kind == "memory_creep" and a.evidence["rate"].value == pytest.approx(rate, rel=0.10)
    per_fit = max(Rules().creep_min_samples, Rules().creep_window // every)
    assert raised is not None and raised <= FIRST + max(200, every * per_fit * 3 // 2 + 8)


def test_rss_creep_on_a_cpu_run_and_one_jump_is_not_creep():
    rng = np.random.default_rng(4)
    grow = 7e8 + 64 * 1024 * np.arange(600)  # 64 KiB a step on RSS
    (a,), _ = analyze_series(series(jitter(rng, 600), rss_B=grow), clean_baseline(rng))
    assert a.kind == "memory_creep" and a.evidence["rate"].value == pytest.approx(64 * 1024, rel=0.10)
    assert a.evidence["memory"].note == "rss_B"
    jump = np.full(600, 7e8)
    jump[300:] += 200e6  # the allocator grew once: not a steady growth
    assert analyze_series(series(jitter(rng, 600), rss_B=jump), clean_baseline(rng))[0] == []


def test_a_data_loader_taking_40_percent_of_the_step_is_input_bound_from_where_it_began():
    rng = np.random.default_rng(5)
    x = jitter(rng, 300)
    wait = 0.3 * MS * rng.random(300)
    wait[120:] = 0.4 * x[120:]
    alerts, _ = analyze_series(series(x, input_wait_s=wait), clean_baseline(rng))
    (a,) = alerts
    assert a.kind == "input_bound" and abs(a.first_step - (FIRST + 120)) <= 1
    assert a.evidence["input_share"].value == pytest.approx(40, abs=1.5) and a.evidence["input_share"].unit == "%"
    assert "host clock" in a.message
    stall = np.where(np.arange(300) >= 120, 0.4 * x, 0.0)
    (d,), _ = analyze_series(series(x, input_wait_s=wait, input_stall_s=stall), clean_baseline(rng))
    assert "device clock" in d.message


def test_spikes_one_step_and_a_burst_each_an_alert_and_the_watchs_own_time_never_one():
    rng = np.random.default_rng(6)
    base = clean_baseline(rng)
    x = jitter(rng, 400)
    own = np.zeros(400)
    x[100] = 60 * MS
    x[250:253] = 40 * MS
    x[320] += 45 * MS
    own[320] = 45 * MS  # lmprof spilled a chunk inside that step
    alerts, _ = analyze_series(series(x, own_s=own), base)
    assert [(a.kind, a.first_step, a.last_step) for a in alerts] == [
        ("spike", FIRST + 100, FIRST + 100), ("spike", FIRST + 250, FIRST + 252)]
    limit = step_slow_limit_ms(base.step_s_median * 1e3, base.step_s_spread * 1e3, 0.0)
    assert alerts[0].evidence["limit"].value >= limit and alerts[0].evidence["worst_step"].value == pytest.approx(60)


def test_alerts_do_not_depend_on_how_the_rows_are_fed():
    rng = np.random.default_rng(7)
    x = jitter(rng, 700)
    x[200] *= 5
    x[400:] *= 2
    wait = np.where(np.arange(700) > 600, 0.5 * x, 0.0)
    mem = 1e9 + 2e5 * np.arange(700)
    rows = series(x, input_wait_s=wait, rss_B=mem)
    base = clean_baseline(rng, memory_bytes=1e9)

    def found(batch):
        an = WatchAnalyzer(base)
        for a in range(0, 700, batch):
            an.feed({k: v[a:a + batch] for k, v in rows.items()})
        return [(a.kind, a.first_step) for a in an.finish()]

    whole = found(700)
    assert {k for k, _ in whole} == {"spike", "drift", "input_bound", "memory_creep"}
    for batch in (1, 5, 64):
        assert sorted(found(batch)) == sorted(whole)


def test_alerts_beyond_the_cap_are_counted_not_kept():
    rng = np.random.default_rng(8)
    x = jitter(rng, 600)
    x[50:600:50] = 80 * MS  # 11 isolated spikes
    alerts, dropped = analyze_series(series(x), clean_baseline(rng), Rules(max_alerts=3))
    assert len(alerts) == 3 and dropped == {"spike": 8}


def test_500_steady_steps_with_realistic_jitter_raise_nothing():
    for seed in range(5):
        rng = np.random.default_rng(100 + seed)
        x = jitter(rng, 500)
        rss = 8e8 + rng.normal(0, 64 * 1024, 500) + 4096 * rng.integers(0, 3, 500)
        wait = 0.2 * MS * rng.lognormal(0, 0.5, 500)
        alerts, dropped = analyze_series(series(x, rss_B=rss, input_wait_s=wait), clean_baseline(rng))
        assert alerts == [] and dropped == {}, [a.message for a in alerts]


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(median_ms=st.floats(0.05, 5000), spread=st.floats(0.0, 0.3),
       unit=st.lists(st.floats(-1.0, 1.0), min_size=20, max_size=300),
       mem_sigma=st.floats(0.0, 0.05), wait_share=st.floats(0.0, 0.2), seed=st.integers(0, 2**31 - 1),
       batch=st.integers(1, 64))
def test_stationary_noise_within_the_baselines_spread_never_alerts(median_ms, spread, unit, mem_sigma, wait_share,
                                                                     seed, batch):
    """Any step times inside [median - spread, median + spread] of the clean steps, in any order (even a long
    stretch at the slowest clean step), with memory and input wait as stationary noise: no alert."""
    med, up = median_ms * MS, spread * median_ms * MS
    base = Baseline(step_s_median=med, step_s_spread=up, n=10, memory_bytes=1e9)
    x = np.maximum(med + up * np.asarray(unit), 1e-9)
    n = len(x)
    rng = np.random.default_rng(seed)
    mem = 1e9 * (1 + mem_sigma * rng.standard_normal(n))
    wait = x * wait_share * rng.random(n)
    rows = series(x, mem_allocated_B=mem, input_wait_s=wait)
    an = WatchAnalyzer(base)
    for a in range(0, n, batch):
        an.feed({k: v[a:a + batch] for k, v in rows.items()})
    assert an.finish() == []


def test_theil_sen_is_the_median_slope_and_shrugs_off_outliers():
    x = np.arange(50, dtype=float)
    y = 3.0 * x + 7.0
    y[[5, 17, 33]] += 1e6
    slope, icpt = theil_sen(x, y)
    assert slope == pytest.approx(3.0) and icpt == pytest.approx(7.0)


def test_the_rank_whose_input_wait_grows_is_named_and_equal_ranks_are_not():
    rng = np.random.default_rng(9)
    steps = np.arange(FIRST, FIRST + 200)
    step_s = 50 * MS
    waits = {r: 0.5 * MS * rng.lognormal(0, 0.3, 200) for r in range(4)}
    assert stragglers({r: (steps, w) for r, w in waits.items()}, figure="input wait", step_s=step_s) == []
    waits[2][80:] += 30 * MS  # rank 2's loader reads a slow shard from step 80 on
    (a,) = stragglers({r: (steps, w) for r, w in waits.items()}, figure="input wait", step_s=step_s)
    assert a.kind == "straggler" and a.evidence["rank"].value == 2 and "rank 2" in a.message
    assert abs(a.first_step - (FIRST + 80)) <= Rules().window // 2 + 1 and a.last_step == FIRST + 199
    # a rank slower by less than FAST_MIN_SHARE of the step is not worth naming
    small = {r: (steps, w + (0.5 * FAST_MIN_SHARE * step_s if r == 1 else 0.0)) for r, w in enumerate(
        [0.5 * MS * rng.lognormal(0, 0.3, 200) for _ in range(2)])}
    assert stragglers(small, figure="input wait", step_s=step_s) == []
    assert stragglers({0: (steps, waits[0])}, figure="input wait", step_s=step_s) == []


def test_a_baseline_of_fewer_than_3_clean_steps_judges_no_step_time_and_says_so():
    rng = np.random.default_rng(10)
    x = jitter(rng, 200)
    x[100:] *= 3
    an = WatchAnalyzer(Baseline.from_samples([0.01, 0.0101]))
    an.feed(series(x))
    assert an.finish() == [] and "fewer than the 3 a spread needs" in an.notes[0]


def test_rules_refuse_windows_too_small_to_have_a_median():
    with pytest.raises(ValueError):
        Rules(window=2)
