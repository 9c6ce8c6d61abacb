"""energy="estimate": a stated-TDP model, labelled estimated everywhere, never mixed with measured."""
from __future__ import annotations

import pytest

from lmprof.errors import ConfigError
from lmprof.measure.energy import EnergyMonitor, energy_metrics
from lmprof.measure.energy.estimate import EstimateMeter
from lmprof.measure.energy.rapl import RaplMeter


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_model_power_and_energy() -> None:
    clock = FakeClock()
    m = EstimateMeter(domain="gpu:0", tdp_w=400, utilisation=0.5, idle_fraction=0.25, clock=clock)
    assert m.idle_w == 100.0 and m.watts == 250.0
    m.begin()
    clock.t = 2.0
    win = m.end()
    assert win.joules == 500.0 and win.method == "model"
    assert win.note and "not measured" in win.note and "TDP 400 W" in win.note


def test_estimate_mode_labels_everything_estimated() -> None:
    clock = FakeClock()
    slept: list[float] = []
    mon = EnergyMonitor.for_device("cuda:0", "estimate", tdp_w=700, clock=clock, sleep=slept.append)
    mon.measure_idle()
    assert slept == []  # a modelled idle needs no waiting
    mon.begin()
    clock.t = 4.0
    result = mon.end()
    assert result.source == "estimated"
    assert result.explanation().startswith("energy (estimated, not measured):")
    metrics = energy_metrics(result, steps=8, tokens=4096, flops=1e15)
    assert metrics, "estimate mode must still produce figures"
    for key, metric in metrics.items():
        assert key.startswith("energy.estimated."), key
        assert metric.source == "estimated", key
    assert "energy.total" not in metrics
    total = metrics["energy.estimated.total"]
    # idle 20 % of 700 W = 140 W; full utilisation -> 700 W for 4 s
    assert total.value == 2800.0
    assert total.note and "not measured" in total.note
    assert metrics["energy.estimated.power.idle"].value == pytest.approx(140.0)
    assert metrics["energy.estimated.per_step"].value == 350.0


def test_estimate_needs_a_stated_tdp() -> None:
    with pytest.raises(ConfigError, match="tdp_w"):
        EnergyMonitor.for_device("cpu", "estimate")
    with pytest.raises(ConfigError):
        EstimateMeter(domain="cpu", tdp_w=0)
    with pytest.raises(ConfigError):
        EstimateMeter(domain="cpu", tdp_w=100, utilisation=1.5)


def test_measured_and_estimated_meters_cannot_share_a_monitor(tmp_path) -> None:
    estimate = EstimateMeter(domain="cpu", tdp_w=100)
    measured = RaplMeter(tmp_path, domain="cpu-package-0")
    with pytest.raises(ConfigError, match="cannot be combined"):
        EnergyMonitor([estimate, measured])


def test_estimate_idle_is_modelled_even_without_measure_idle() -> None:
    clock = FakeClock()
    mon = EnergyMonitor.for_device("cpu", "estimate", tdp_w=100, idle_fraction=0.3, clock=clock)
    mon.begin()
    clock.t = 1.0
    m = energy_metrics(mon.end(), steps=1)
    assert m["energy.estimated.power.idle"].value == pytest.approx(30.0)
    assert m["energy.estimated.above_idle"].value == pytest.approx(70.0)
    assert {x.source for x in m.values()} == {"estimated"}


def test_a_window_is_read_once_and_an_end_needs_a_begin() -> None:
    """Every window (a meter's, the monitor's, the poller's) ends once: a second end(), or an end()
    without begin(), is an error, never a window measured from an old start (base.WindowClock)."""
    from lmprof.measure.energy.base import MeterError
    from lmprof.measure.energy.polling import PowerPoller

    clock = FakeClock()
    meter = EstimateMeter(domain="gpu:0", tdp_w=400, clock=clock)
    mon = EnergyMonitor([meter], mode="estimate", clock=clock, sleep=lambda s: None)
    poller = PowerPoller(lambda: 10.0, clock=clock, interval_s=0.5, sync_edges=True, threaded=False)
    for begin, end in ((meter.begin, meter.end), (mon.begin, mon.end), (poller.start, poller.stop)):
        with pytest.raises(MeterError, match="without begin"):
            end()
        clock.t += 1.0
        begin()
        clock.t += 2.0
        first = end()
        assert getattr(first, "seconds", None) == 2.0 or first[1] == 2.0  # the poller gives (J, s, samples)
        with pytest.raises(MeterError, match="without begin"):
            end()
