"""A calibration on a disturbed machine is refused, a cached one is not used for MFU, and no
utilisation above 100% is given as a figure. Timings are injected (the timer is replaced), never taken.
"""
from __future__ import annotations

import socket
from typing import Callable

import pytest

from lmprof.hardware.cpu_load import OtherLoad

from lmprof.estimate.mfu import mfu_metrics
from lmprof.cli.main import main
from lmprof.hardware import calibrate as cal_mod
from lmprof.hardware.calibrate import Calibration, Peak, calibrate, disturbed_reason, resolve_peak, save_calibration
from lmprof.show.roofline_plot import y_range
from lmprof.workloads.gpt import preset


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("LMPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(cal_mod, "_loadavg", lambda: 0.0)
    monkeypatch.setattr("lmprof.hardware.cpu_load.other_load", lambda before, after, kind: OtherLoad(0.0, 0.02, 1.0, 0.01, 1, 2))
    return tmp_path / "cache"


def inject(monkeypatch: pytest.MonkeyPatch, samples: list[float]) -> None:
    """Every timed measurement returns ``samples`` (seconds per call); the call itself still runs once."""
    def timed(fn: Callable[[], object], sync: Callable[[], None], budget_s: float, max_samples: int = 200) -> list[float]:
        fn()
        return list(samples)
    monkeypatch.setattr("lmprof.hardware.ceilings._timed", timed)


STEADY = [1e-3, 1.01e-3, 0.99e-3, 1e-3, 1.02e-3, 1e-3]
# The busy machine: most repeats 13x slower than the idle ones.
DISTURBED = [1e-3, 13e-3, 12e-3, 1e-3, 14e-3, 13e-3]


def test_steady_calibration_is_saved_with_its_spread(monkeypatch, isolated) -> None:
    inject(monkeypatch, STEADY)
    cal = calibrate("cpu", ["fp32"], seconds=0.1, sizes=[32], copy_bytes=2**16)
    assert cal.disturbed is None and cal.path
    m = cal.matmul["fp32"]
    assert m["flops_per_s"] == pytest.approx(2 * 32**3 / 1e-3)  # median 1 ms per 32^3 matmul
    assert m["spread"] == pytest.approx(cal_mod.spread(STEADY)) and m["spread"] < cal_mod.SPREAD_LIMIT
    assert resolve_peak(cal.device_name, "cpu", "fp32").flops_per_s == m["flops_per_s"]


def test_disturbed_repeats_are_refused(monkeypatch, isolated) -> None:
    inject(monkeypatch, DISTURBED)
    cal = calibrate("cpu", ["fp32"], seconds=0.1, sizes=[32], copy_bytes=2**16)
    assert cal.path is None and not list(isolated.glob("calibration-*.json"))
    assert cal.disturbed and "fp32 matmul repeats vary" in cal.disturbed and "copy repeats vary" in cal.disturbed
    peak = resolve_peak(cal.device_name, "cpu", "fp32")
    assert not (peak.source or "").startswith("calibrated:")  # at most this CPU's estimate from cpuinfo


def test_busy_load_is_refused(monkeypatch, isolated) -> None:
    inject(monkeypatch, STEADY)
    monkeypatch.setattr(cal_mod, "_loadavg", lambda: 7.5)
    monkeypatch.setattr(cal_mod.os, "cpu_count", lambda: 2)
    cal = calibrate("cpu", ["fp32"], seconds=0.1, sizes=[32], copy_bytes=2**16)
    assert cal.path is None and cal.disturbed and "load average 7.5 on 2 CPUs" in cal.disturbed


def test_other_processes_read_by_the_counters() -> None:
    cal = Calibration(device="cpu", device_name="x", hostname="h", created="c", torch="t", threads=1, seconds=1,
                      cpu_count=2)
    # 0.2 of the 1 core left free: under 0.25
    assert disturbed_reason(cal, OtherLoad(0.2, 0.02, 1.0, 0.01, 1, 2)) is None
    reason = disturbed_reason(cal, OtherLoad(0.8, 0.02, 1.0, 0.01, 1, 2)) or ""
    assert "other processes kept 0.80 +- 0.02 of 2 cores busy" in reason


def test_a_busy_cached_calibration_is_not_used_for_mfu(isolated) -> None:
    # The cache: 16.8 GFLOP/s stored from a busy machine (222 when idle), a warning only; every
    # later run then showed MFU 720%.
    cal = Calibration(device="cpu", device_name="AMD EPYC", hostname=socket.gethostname(), created="2026-11-01",
                      torch="2", threads=1, seconds=3, loadavg=1.9, cpu_count=2)
    cal.matmul = {"fp32": {"flops_per_s": 16.8e9, "size": 512, "n": 20, "by_size": {}}}
    cal.bandwidth = {"bytes_per_s": 5e9, "nbytes": 1, "method": "copy", "n": 3}
    save_calibration(cal, isolated)
    peak = resolve_peak("AMD EPYC", "cpu", "fp32", threads=1)
    assert peak.flops_per_s != 16.8e9
    assert "taken on a disturbed machine (the machine was busy (load average 1.9 on 2 CPUs)" in peak.note


def test_cli_refuses_a_disturbed_calibration(monkeypatch, isolated, capsys) -> None:
    inject(monkeypatch, DISTURBED)
    code = main(["calibrate", "--seconds", "0.1", "--sizes", "32", "--dtypes", "fp32"])
    captured = capsys.readouterr()
    assert code == 1
    assert "p90/p10 " in captured.out  # the figures are printed with their spread
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("lmprof: calibration refused, not saved and not used for MFU")
    assert not list(isolated.glob("calibration-*.json"))


def test_cli_refuses_when_other_processes_ran(monkeypatch, isolated, capsys) -> None:
    inject(monkeypatch, STEADY)
    monkeypatch.setattr("lmprof.hardware.cpu_load.other_load", lambda before, after, kind: OtherLoad(1.5, 0.02, 1.0, 0.01, 1, 2))
    assert main(["calibrate", "--seconds", "0.1", "--sizes", "32", "--dtypes", "fp32"]) == 1
    assert "other processes kept 1.50 +- 0.02" in capsys.readouterr().err


def test_mfu_above_100_pct_is_never_a_figure() -> None:
    shape = preset("tiny").shape()
    low_peak = Peak(flops_per_s=1e6, bytes_per_s=1e6, source="calibrated:x", note="test")
    out = mfu_metrics(shape, batch=8, seq_len=64, mode="train", time_s=0.025, device_name="x", device_kind="cpu",
                      dtype="fp32", peak=low_peak)
    for key in ("mfu", "hfu", "mbu"):
        assert out[key].value is None and "above 100%" in (out[key].note or ""), key
    fair = Peak(flops_per_s=1e15, bytes_per_s=1e15, source="table:x", note="test")
    ok = mfu_metrics(shape, batch=8, seq_len=64, mode="train", time_s=0.025, device_name="x", device_kind="cpu",
                     dtype="fp32", peak=fair)
    model = ok["flops.model_per_step"].value
    assert ok["mfu"].value == pytest.approx(100 * model / 0.025 / 1e15)


def test_roofline_plot_keeps_points_above_the_ceiling() -> None:
    # A 16.8 GFLOP/s ceiling and matmul blocks achieving 120 GFLOP/s: the old range (3x the peak) cut them off.
    lo, hi = y_range([5e9, 120e9], peak_flops=16.8e9, roof_at_xmin=1e8)
    assert lo <= 1e8 / 4 and hi >= 120e9 * 2
    assert y_range([1e9], peak_flops=16.8e9, roof_at_xmin=1e8)[1] == pytest.approx(3 * 16.8e9)


def test_summary_marks_a_block_above_its_roof() -> None:
    from rich.console import Console

    from lmprof.record.run import Env, Run
    from lmprof.show.summary import roofline_table

    env = Env(device="cpu", device_name="x", torch="2", python="3", lmprof="0", os="linux", cpu="cpu", threads=1)
    run = Run(id="r", mode="train", created="2026-01-01T00:00:00Z", env=env, config={})
    run.tables["roofline"] = [
        {"name": "mlp.fc", "phase": "forward", "flops": 1e9, "intensity": 30.0, "achieved_flops_per_s": 121e9,
         "roof_fraction": 7.2, "bound": "compute-bound", "time_s": 0.01},
        {"name": "ln_1", "phase": "forward", "flops": 1e6, "intensity": 0.9, "achieved_flops_per_s": 1e8,
         "roof_fraction": 0.25, "bound": "memory-bound", "time_s": 0.001}]
    console = Console(width=200, record=True)
    console.print(roofline_table(run))
    text = console.export_text()
    assert "720" not in text and "n/a (above roof: peak too low)" in text and "25.0%" in text
