"""NVML meter against a fake pynvml module: exact joules from the counter, exact integration when polling."""
from __future__ import annotations

import sys
import time

import pytest

from lmprof.measure.energy.base import MeterError
from lmprof.measure.energy.nvml import NvmlMeter, main


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeNvml:
    """The pynvml functions NvmlMeter calls, over one fake GPU (mJ counter, mW power)."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, energy_counter: bool = True, power: bool = True, init_fails: bool = False) -> None:
        self.energy_mj = 5_000_000  # counters start far from zero, as after hours of uptime
        self.power_mw = 0
        self.energy_counter = energy_counter
        self.power = power
        self.init_fails = init_fails
        self.inits = 0
        self.shutdowns = 0
        self.opened_by: tuple[str, object] | None = None

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise self.NVMLError("Invalid Argument")
        self.opened_by = ("index", index)
        return "handle0"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if not uuid.startswith("GPU-"):
            raise self.NVMLError("Not Found")
        self.opened_by = ("uuid", uuid)
        return "handle0"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        if not self.energy_counter:
            raise self.NVMLError("Not Supported")
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        if not self.power:
            raise self.NVMLError("Not Supported")
        return self.power_mw


def test_counter_gives_exact_joules_in_millijoule_units() -> None:
    nv, clock = FakeNvml(), FakeClock()
    meter = NvmlMeter(0, nvml=nv, clock=clock)
    avail = meter.probe()
    assert avail.ok and meter.method == "counter"
    assert meter.device_name == "Fake GPU"
    meter.begin()
    nv.energy_mj += 12_345  # 12.345 J
    clock.t += 0.5
    win = meter.end()
    assert win.joules == 12.345
    assert win.seconds == 0.5
    assert win.watts == pytest.approx(24.69)
    assert win.method == "counter"
    meter.close()
    assert nv.shutdowns == 1


def test_counter_windows_repeat() -> None:
    nv, clock = FakeNvml(), FakeClock()
    meter = NvmlMeter(0, nvml=nv, clock=clock)
    assert meter.probe().ok
    for joules in (1.0, 250.0):
        meter.begin()
        nv.energy_mj += int(joules * 1000)
        clock.t += 2.0
        assert meter.end().joules == joules


def test_counter_going_backwards_is_an_error_not_a_negative_reading() -> None:
    nv = FakeNvml()
    meter = NvmlMeter(0, nvml=nv, clock=FakeClock())
    assert meter.probe().ok
    meter.begin()
    nv.energy_mj = 10  # driver reloaded mid-window
    with pytest.raises(MeterError, match="backwards"):
        meter.end()


def test_gpu_without_energy_counter_polls_power_and_integrates_exactly() -> None:
    nv, clock = FakeNvml(energy_counter=False), FakeClock(0.0)
    meter = NvmlMeter(0, nvml=nv, clock=clock, threaded=False)
    avail = meter.probe()
    assert avail.ok and meter.method == "power-polling"
    nv.power_mw = 100_000  # 100 W, in NVML's milliwatts
    meter.begin()  # sample (0 s, 100 W)
    clock.t, nv.power_mw = 1.0, 200_000
    meter.sample()  # (1 s, 200 W)
    clock.t = 3.0
    meter.sample()  # (3 s, 200 W)
    win = meter.end()  # edge sample at 3 s
    # trapezoids: 0..1 s averages 150 W -> 150 J; 1..3 s at 200 W -> 400 J
    assert win.joules == 550.0
    assert win.seconds == 3.0
    assert win.method == "power-polling"
    assert win.samples == 4


def test_polling_thread_samples_in_background() -> None:
    nv = FakeNvml(energy_counter=False)
    nv.power_mw = 250_000
    meter = NvmlMeter(0, nvml=nv, poll_interval_s=0.002)  # real clock, real thread
    assert meter.probe().ok
    meter.begin()
    time.sleep(0.05)
    win = meter.end()
    meter.close()
    assert win.samples is not None and win.samples >= 3
    # Constant power integrates to exactly power x window whatever the sample times.
    assert win.joules == pytest.approx(250.0 * win.seconds)


def test_force_polling_uses_power_even_with_a_counter() -> None:
    meter = NvmlMeter(0, nvml=FakeNvml(), force_polling=True, threaded=False)
    assert meter.probe().ok and meter.method == "power-polling"
    assert meter.min_window_s >= 1.0  # driver power is averaged over up to a second


def test_no_driver_is_unavailable_with_reason() -> None:
    meter = NvmlMeter(0, nvml=FakeNvml(init_fails=True))
    avail = meter.probe()
    assert not avail.ok
    assert "NVML" in avail.reason and "Library Not Found" in avail.reason


def test_gpu_with_neither_counter_nor_power_is_unavailable() -> None:
    avail = NvmlMeter(0, nvml=FakeNvml(energy_counter=False, power=False)).probe()
    assert not avail.ok and "neither" in avail.reason


def test_missing_gpu_index_is_unavailable() -> None:
    avail = NvmlMeter(3, nvml=FakeNvml()).probe()
    assert not avail.ok and "gpu:3" in avail.reason


def test_uuid_from_torch_gets_the_nvml_prefix() -> None:
    nv = FakeNvml()
    meter = NvmlMeter(0, uuid="58e9b5c1-0000-1111-2222-333344445555", nvml=nv)
    assert meter.probe().ok
    assert nv.opened_by == ("uuid", "GPU-58e9b5c1-0000-1111-2222-333344445555")


def test_missing_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    avail = NvmlMeter(0).probe()
    assert not avail.ok and "pynvml" in avail.reason


def test_module_main_reports_in_one_line_and_never_crashes(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--seconds", "0.01"])  # real pynvml: n/a here, a reading on a GPU machine
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert "gpu:0" in out
