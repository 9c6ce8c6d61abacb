"""The monitor: meter choice per device, idle baseline, window alignment, short-window warning, n/a lines."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.errors import ConfigError
from lmprof.hardware.devices import resolve_device
from lmprof.measure.energy import EnergyMonitor, EnergyWindow, energy_metrics, steps_for_window
from lmprof.measure.energy.apple import PowermetricsMeter
from lmprof.measure.energy.base import Availability, EnergyMeter


class FakeNvml:
    """Minimal pynvml stand-in: one GPU with an energy counter in mJ."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, present: bool = True) -> None:
        self.present = present
        self.energy_mj = 1_000_000

    def nvmlInit(self) -> None:
        if not self.present:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return "h0"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 0


class Machine:
    """A fake clock plus the counters it drives: one GPU (NVML) and one CPU package (RAPL files)."""

    def __init__(self, root: Path) -> None:
        self.t = 0.0
        self.nvml = FakeNvml()
        self.gpu_w = 0.0
        self.cpu_w = 0.0
        self.root = root
        self.pkg = root / "intel-rapl:0"
        self.pkg.mkdir(parents=True)
        (self.pkg / "name").write_text("package-0\n")
        (self.pkg / "max_energy_range_uj").write_text("262143328850\n")
        self.cpu_uj = 5_000_000
        self._write()

    def _write(self) -> None:
        (self.pkg / "energy_uj").write_text(f"{self.cpu_uj}\n")

    def clock(self) -> float:
        return self.t

    def run(self, seconds: float) -> None:
        """Let time pass at the current power draw (also used as the monitor's sleep)."""
        self.t += seconds
        self.nvml.energy_mj += round(self.gpu_w * seconds * 1000)
        self.cpu_uj += round(self.cpu_w * seconds * 1_000_000)
        self._write()

    def monitor(self, **kw: object) -> EnergyMonitor:
        return EnergyMonitor.for_device(
            "cuda:0", "auto", nvml=self.nvml, powercap_root=self.root, clock=self.clock, sleep=self.run, **kw
        )


@pytest.fixture()
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path / "powercap")


def test_cuda_uses_nvml_for_the_gpu_and_rapl_for_the_host(machine: Machine) -> None:
    mon = machine.monitor()
    assert [(m.domain, a.ok) for m, a in mon.meters] == [("gpu:0", True), ("cpu-package-0", True)]
    assert mon.describe() == "energy meters: gpu:0 (nvml counter), cpu-package-0 (rapl counter)"


def test_idle_baseline_then_window_aligned_with_steps(machine: Machine) -> None:
    mon = machine.monitor(idle_s=1.5)
    machine.gpu_w, machine.cpu_w = 60.0, 20.0
    mon.measure_idle()  # sleeps 1.5 s of fake time at idle power
    machine.gpu_w, machine.cpu_w = 300.0, 50.0
    machine.run(5.0)  # warm-up: outside the window, must not count
    mon.begin()
    machine.run(2.0)  # the measured steps
    result = mon.end()
    machine.run(3.0)  # after the window: must not count
    assert result.seconds == 2.0
    assert result.total_joules == pytest.approx(700.0)  # (300 + 50) W x 2 s
    assert result.idle_watts == pytest.approx(80.0)
    assert result.above_idle_joules == pytest.approx(700.0 - 160.0)
    assert result.average_watts == pytest.approx(350.0)
    assert result.warnings == []
    line = result.explanation()
    assert "\n" not in line and line.startswith("energy: 700 J over 2 s")
    assert "gpu:0 (nvml counter) + cpu-package-0 (rapl counter)" in line

    m = energy_metrics(result, steps=10, tokens=1000, flops=7e15)
    assert (m["energy.total"].value, m["energy.total"].unit, m["energy.total"].source) == (
        pytest.approx(700.0), "J", "measured")
    assert (m["energy.above_idle"].value, m["energy.above_idle"].source) == (pytest.approx(540.0), "derived")
    assert (m["energy.power.avg"].unit, m["energy.power.avg"].source) == ("W", "derived")
    assert (m["energy.power.idle"].value, m["energy.power.idle"].source) == (pytest.approx(80.0), "measured")
    assert (m["energy.per_step"].value, m["energy.per_step"].unit) == (pytest.approx(70.0), "J/step")
    assert (m["energy.per_token"].value, m["energy.per_token"].unit) == (pytest.approx(0.7), "J/token")
    assert (m["energy.flop_per_joule"].value, m["energy.flop_per_joule"].unit) == (pytest.approx(1e13), "FLOP/J")
    assert m["energy.window"].value == 2.0 and m["energy.window"].unit == "s"
    assert m["energy.domain.gpu:0"].value == pytest.approx(600.0)
    assert m["energy.domain.cpu-package-0"].value == pytest.approx(100.0)
    assert not any(k.startswith("energy.estimated") for k in m)


def test_inference_runs_name_their_units_by_the_mode(machine: Machine) -> None:
    mon = machine.monitor()
    machine.gpu_w = 100.0
    mon.begin()
    machine.run(4.0)
    r = mon.end()
    m = energy_metrics(r, steps=4, tokens=512, mode="infer")
    assert m["energy.per_generated_token"].unit == "J/generated token"
    assert m["energy.per_generated_token"].value == pytest.approx(400.0 / 512)
    assert m["energy.per_generation"].unit == "J/generation"
    assert "energy.per_step" not in m and "energy.per_token" not in m
    assert m["energy.power.idle"].value is None  # no baseline was measured
    assert "measure_idle" in (m["energy.power.idle"].note or "")


def test_short_window_warns_and_recommends_a_length(machine: Machine) -> None:
    mon = machine.monitor()
    assert mon.min_window_s == pytest.approx(1.0)  # NVML counter: 10 x ~100 ms
    mon.begin()
    machine.run(0.05)
    result = mon.end()
    gpu_warnings = [w for w in result.warnings if "gpu:0" in w]
    assert len(gpu_warnings) == 1
    assert "shorter than the nvml update period" in gpu_warnings[0]
    assert "measure at least 1 s" in gpu_warnings[0]
    # RAPL updates every ~1 ms (10 ms recommended): 50 ms is plenty for the CPU package.
    assert not any("cpu-package-0" in w for w in result.warnings)

    mon.begin()
    machine.run(0.5)
    soft = mon.end().warnings
    assert len(soft) == 1 and "under the 1 s" in soft[0] and "measure longer" in soft[0]

    mon.begin()
    machine.run(1.0)
    assert mon.end().warnings == []


def test_extra_steps_to_reach_the_minimum_window(machine: Machine) -> None:
    mon = machine.monitor()
    assert mon.extra_steps(step_s=0.03, steps=10) == 24  # ceil(1 / 0.03) = 34 steps in all
    assert mon.extra_steps(step_s=0.5, steps=10) == 0
    assert steps_for_window(0.25, 1.0) == 4
    assert steps_for_window(0.25, 1.0, steps=4) == 0
    assert EnergyMonitor.for_device("cuda:0", "auto", nvml=machine.nvml, powercap_root=machine.root,
                                    min_window_s=3.0).extra_steps(0.5, 2) == 4


def test_no_meter_anywhere_is_one_na_line_and_never_fails(tmp_path: Path) -> None:
    slept: list[float] = []
    mon = EnergyMonitor.for_device(
        "cuda:0", "auto", nvml=FakeNvml(present=False), powercap_root=tmp_path / "none", sleep=slept.append
    )
    assert not mon.available
    mon.measure_idle()
    assert slept == []  # nothing to measure: no idle wait
    mon.begin()
    result = mon.end()
    line = result.explanation()
    assert line.startswith("energy: n/a — ")
    assert "gpu:0: no NVIDIA driver" in line and "cpu: no RAPL powercap interface on this machine" in line
    assert "\n" not in line
    m = energy_metrics(result, steps=10, tokens=100)
    assert m["energy.total"].value is None and m["energy.total"].unit == "J"
    assert "no RAPL powercap" in (m["energy.total"].note or "")
    assert m["energy.domain.gpu:0"].value is None
    assert mon.extra_steps(0.01, 1) == 0


def test_this_machine_auto_mode_never_fails_and_explains_itself() -> None:
    # Real boundaries: on the dev box (no GPU, no /sys/class/powercap) this is n/a with the reason;
    # on a machine with readable counters it is a reading. Either way one line, no exception.
    device = resolve_device("auto")
    with EnergyMonitor.for_device(device, "auto", idle_s=0.05) as mon:
        mon.measure_idle()
        mon.begin()
        result = mon.end()
    line = result.explanation()
    assert line.startswith("energy") and "\n" not in line
    if not result.available:
        assert line.startswith("energy: n/a — ") and len(line) > len("energy: n/a — ") + 10
        assert energy_metrics(result, steps=1)["energy.total"].note


def test_gpu_measured_cpu_unreadable_total_says_what_it_covers(machine: Machine) -> None:
    def root_only(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    mon = machine.monitor(read=root_only)
    machine.gpu_w = 200.0
    mon.begin()
    machine.run(2.0)
    r = mon.end()
    assert r.total_joules == pytest.approx(400.0)
    line = r.explanation()
    assert "gpu:0 (nvml counter)" in line and "n/a: cpu-package-0: cannot read" in line and "permission denied" in line
    assert "not included (n/a): cpu-package-0" in (energy_metrics(r, steps=1)["energy.total"].note or "")


class Exploding(EnergyMeter):
    name, domain, update_period_s = "boom", "gpu:9", 0.001

    def probe(self) -> Availability:
        return Availability(True)

    def begin(self) -> None:
        pass

    def end(self) -> EnergyWindow:
        raise RuntimeError("driver fell over")


def test_a_meter_failing_mid_window_becomes_na() -> None:
    mon = EnergyMonitor([Exploding()], clock=lambda: 0.0)
    mon.begin()
    r = mon.end()
    assert not r.available and "driver fell over" in r.explanation()


def test_mps_uses_powermetrics_and_reports_why_not() -> None:
    mon = EnergyMonitor.for_device("mps", "auto", apple=lambda: PowermetricsMeter(platform="linux"))
    mon.begin()
    assert mon.end().explanation() == "energy: n/a — powermetrics is macOS-only"


def test_off_mode_reads_nothing() -> None:
    mon = EnergyMonitor.for_device(resolve_device("cpu"), "off")
    assert mon.meters == [] and mon.describe() == "energy: off"
    mon.measure_idle()
    mon.begin()
    r = mon.end()
    assert r.explanation() == "energy: off"
    assert energy_metrics(r, steps=3) == {}


def test_bad_mode_and_misuse() -> None:
    with pytest.raises(ConfigError):
        EnergyMonitor.for_device("cpu", "sometimes")  # type: ignore[arg-type]
    mon = EnergyMonitor([], clock=lambda: 0.0)
    with pytest.raises(RuntimeError):
        mon.end()
    mon.begin()
    with pytest.raises(RuntimeError):
        mon.begin()


def test_rows_for_the_run_table(machine: Machine) -> None:
    mon = machine.monitor()
    machine.gpu_w = 10.0
    mon.begin()
    machine.run(1.0)
    rows = mon.end().rows()
    assert [r["domain"] for r in rows] == ["gpu:0", "cpu-package-0"]
    assert rows[0]["joules"] == pytest.approx(10.0) and rows[0]["watts"] == pytest.approx(10.0)
    assert rows[0]["source"] == "measured" and rows[0]["method"] == "counter"
