"""A CPU run without a calibration measures its memory bandwidth on the fly (hardware/quick_bandwidth.py).

The copy's timings are injected (``calibrate._timed``, the sampler inside ``measure_bandwidth``) so the
figures are known in advance and a busy test machine cannot refuse the check; one test lets it run for
real. The truth for the bandwidth is written here by hand: 128 MiB read + 128 MiB written per copy,
divided by the median of the injected seconds.
"""
from __future__ import annotations

import json
import socket
import statistics
from pathlib import Path

import pytest

from lmprof.hardware.cpu_load import OtherLoad
import torch

import lmprof.hardware.calibrate as cal
from lmprof.cli.main import main
from lmprof.hardware.devices import cpu_model
from lmprof.record.run import Run

COPY_BYTES = 128 * 2**20  # the CPU copy of measure_bandwidth: past any last-level cache
STEADY = [0.0100, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098, 0.0100, 0.0101, 0.0099, 0.0100]  # p90/p10 ~1.04
DISTURBED = [0.010, 0.021, 0.010, 0.030, 0.011, 0.019, 0.010, 0.025, 0.010, 0.012]  # p90/p10 ~3


@pytest.fixture(autouse=True)
def quick_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The check turned back on (conftest turns it off), with an empty cache of this test's own."""
    monkeypatch.delenv("LMPROF_NO_QUICK_CALIBRATION", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("LMPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


QUIET = OtherLoad(cores=0.0, uncertainty=0.07, window_s=0.3, tick_s=0.01, free=1, cpus=2)


def inject(monkeypatch: pytest.MonkeyPatch, samples: list[float], quiet: bool = True) -> list[int]:
    """Make every copy timing return ``samples`` without copying, on a machine whose CPU-time counters
    read quiet (``quiet``; else as they are); returns a list counting the calls."""
    calls: list[int] = []
    if quiet:
        monkeypatch.setattr("lmprof.hardware.cpu_load.other_load", lambda before, after, kind: QUIET)

    def timed(fn, sync, budget_s, max_samples=200):
        calls.append(1)
        assert budget_s <= 0.3  # the quick budget, not a calibration's
        return list(samples)

    monkeypatch.setattr("lmprof.hardware.ceilings._timed", timed)
    return calls


def forbid_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("measured the bandwidth although it should not have")

    monkeypatch.setattr("lmprof.hardware.ceilings.measure_bandwidth", boom)


def train(tmp_path: Path, name: str) -> Run:
    out = tmp_path / name
    # The cheapest real training run (as tests/test_hostile_outputs.py): one layer, 8 tokens, two timed steps.
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                 "-t", "8", "--batch-size", "2", "--steps", "2", "--warmup", "0", "--profile-steps", "1",
                 "--energy", "off", "--no-report", "--no-plots", "--out", str(out)]) == 0
    (folder,) = out.iterdir()
    return Run.load(folder)


def cache_file(cache: Path) -> Path:
    files = list(cache.glob("calibration-*.json")) if cache.is_dir() else []
    assert len(files) <= 1, files
    return files[0] if files else cache / "none"


def by_hand(samples: list[float]) -> float:
    return 2 * COPY_BYTES / statistics.median(samples)  # each byte read once and written once


def check_mbu(run: Run, bandwidth: float) -> None:
    step_s = run.metrics["step_time"].value / 1e3
    nbytes = run.metrics["bytes.model_per_step"].value
    assert run.metrics["peak.bandwidth"].value == pytest.approx(bandwidth, rel=1e-12)
    assert run.metrics["peak.bandwidth"].source == "measured"
    assert run.metrics["mbu"].value == pytest.approx(100 * nbytes / step_s / bandwidth, rel=1e-9)
    assert "on the fly" in run.metrics["mbu"].note and "`lmprof calibrate` for a full one" in run.metrics["mbu"].note
    assert "128 MiB copied" in run.metrics["mbu"].note


def test_a_cpu_run_measures_caches_and_then_reads_its_bandwidth(tmp_path, monkeypatch, quick_on):
    calls = inject(monkeypatch, STEADY)
    first = train(tmp_path, "first")
    assert len(calls) == 1  # once, although the peak is resolved twice
    check_mbu(first, by_hand(STEADY))
    assert "roofline" in first.tables and not any(n.startswith("no roofline") for n in first.notes)
    record = json.loads(cache_file(quick_on).read_text())
    assert record["quick"] is True and record["matmul"] == {}
    assert record["bandwidth"]["bytes_per_s"] == pytest.approx(by_hand(STEADY), rel=1e-12)
    assert record["bandwidth"]["nbytes"] == COPY_BYTES
    assert (record["device_name"], record["threads"], record["hostname"]) == (
        cpu_model(), torch.get_num_threads(), socket.gethostname())

    forbid_measuring(monkeypatch)  # the second run reads the cache
    second = train(tmp_path, "second")
    check_mbu(second, by_hand(STEADY))
    assert f"cached in {cache_file(quick_on)}" in second.metrics["peak.flops"].note


def test_a_disturbed_check_is_neither_kept_nor_used(tmp_path, monkeypatch, quick_on):
    qs = statistics.quantiles(DISTURBED, n=10)
    assert qs[-1] / qs[0] > 1.25  # the injected repeats really disagree by more than the limit
    calls = inject(monkeypatch, DISTURBED)
    run = train(tmp_path, "run")
    assert len(calls) == 1  # not measured again for the roofline after being refused
    assert run.value("mbu") is None and run.value("peak.bandwidth") is None
    assert "quick bandwidth check was disturbed" in run.metrics["mbu"].note
    assert "copy repeats vary" in run.metrics["mbu"].note and "not kept" in run.metrics["mbu"].note
    said = [n for n in run.notes if "quick bandwidth check" in n]
    assert len(said) == 1 and said[0].startswith("no roofline")
    assert "roofline" not in run.tables
    assert not cache_file(quick_on).exists()
    assert run.value("mfu") is not None  # the FLOP/s estimate does not depend on it


def test_the_opt_out_measures_nothing(tmp_path, monkeypatch, quick_on):
    monkeypatch.setenv("LMPROF_NO_QUICK_CALIBRATION", "1")
    forbid_measuring(monkeypatch)
    run = train(tmp_path, "run")
    assert run.value("mbu") is None and "LMPROF_NO_QUICK_CALIBRATION=1" in run.metrics["mbu"].note
    assert not cache_file(quick_on).exists()


def test_a_failing_check_costs_the_run_nothing_but_the_figure(tmp_path, monkeypatch, quick_on):
    def broken(*a, **k):
        raise RuntimeError("no memory for the copy")

    monkeypatch.setattr("lmprof.hardware.ceilings.measure_bandwidth", broken)
    run = train(tmp_path, "run")
    assert run.value("mbu") is None
    assert "quick bandwidth check failed (RuntimeError: no memory for the copy)" in run.metrics["mbu"].note
    assert not cache_file(quick_on).exists()


def test_a_calibration_is_never_overwritten(tmp_path, monkeypatch, quick_on):
    """A calibration for another thread count is not this run's, and not the check's to replace."""
    other = cal.Calibration(device="cpu", device_name=cpu_model(), hostname=socket.gethostname(),
                            created="2026-01-01T00:00:00+00:00", torch="x", threads=torch.get_num_threads() + 1,
                            seconds=3.0, matmul={"fp32": {"flops_per_s": 1e11, "size": 256, "n": 3}},
                            bandwidth={"bytes_per_s": 1e10, "nbytes": 1, "method": "copy", "n": 3})
    path = cal.save_calibration(other, quick_on)
    before = path.read_bytes()
    inject(monkeypatch, STEADY)
    run = train(tmp_path, "run")
    check_mbu(run, by_hand(STEADY))
    assert "not cached" in run.metrics["peak.flops"].note
    assert path.read_bytes() == before


def test_roofline_and_memory_measure_nothing_but_read_a_cached_check(monkeypatch, quick_on, capsys):
    forbid_measuring(monkeypatch)
    assert main(["roofline", "--preset", "tiny", "--device", "cpu", "--dtype", "fp32"]) == 0
    assert "no roofline time without ceilings" in capsys.readouterr().out  # no bandwidth: the table only
    assert main(["memory", "--preset", "tiny", "--device", "cpu"]) == 0
    assert not cache_file(quick_on).exists()
    quick = cal.Calibration(device="cpu", device_name=cpu_model(), hostname=socket.gethostname(),
                            created="2026-01-01T00:00:00+00:00", torch="x", threads=torch.get_num_threads(),
                            seconds=0.25, bandwidth={"bytes_per_s": 2e10, "nbytes": COPY_BYTES, "n": 10,
                                                     "method": "copy (read + write)", "spread": 1.04}, quick=True,
                            load_check="other processes kept 0.00 +- 0.07 of 2 cores busy over 0.30 s")
    cal.save_calibration(quick, quick_on)
    capsys.readouterr()
    assert main(["roofline", "--preset", "tiny", "--device", "cpu", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "measured on the fly" in out and "no roofline time without ceilings" not in out


def test_calibrate_if_missing_does_not_count_a_quick_check(cli, monkeypatch, quick_on):
    quick = cal.Calibration(device="cpu", device_name=cpu_model(), hostname=socket.gethostname(),
                            created="2026-01-01T00:00:00+00:00", torch="x", threads=torch.get_num_threads(),
                            seconds=0.25, bandwidth={"bytes_per_s": 2e10, "nbytes": COPY_BYTES, "n": 10,
                                                     "method": "copy (read + write)", "spread": 1.04}, quick=True,
                            load_check="other processes kept 0.00 +- 0.07 of 2 cores busy over 0.30 s")
    path = cal.save_calibration(quick, quick_on)
    # A quiet machine, injected (as tests/test_hostile_outputs.py does): the full calibration then replaces it.
    monkeypatch.setattr("lmprof.hardware.ceilings._timed", lambda fn, sync, budget_s, max_samples=200: [fn(), 1e-3, 1e-3, 1e-3][1:])
    monkeypatch.setattr(cal, "_loadavg", lambda: 0.0)
    monkeypatch.setattr("lmprof.hardware.cpu_load.other_load", lambda before, after, kind: QUIET)
    code, out, err = cli("calibrate", "--if-missing", "--dtypes", "fp32", "--seconds", "0.2", "--sizes", "32")
    assert code == 0, err
    assert "already cached" not in out and f"saved {path}" in out
    assert json.loads(path.read_text())["quick"] is False


def test_a_real_check(tmp_path, quick_on):
    """Nothing injected: kept with its figure, used for this run only when other processes competed,
    or refused when the copies disagree, with the reason; never a failure."""
    from lmprof.hardware import quick_bandwidth

    with quick_bandwidth.allowed():
        peak = cal.resolve_peak(cpu_model(), "cpu", "fp32")
    if peak.bytes_per_s is None:
        assert "quick bandwidth check was disturbed" in peak.note, peak.note
        assert not cache_file(quick_on).exists()
    elif "DISTURBED" in (peak.bytes_source or ""):
        assert "not cached" in peak.note and not cache_file(quick_on).exists()
    else:
        record = json.loads(cache_file(quick_on).read_text())
        assert record["quick"] is True and peak.bytes_per_s == record["bandwidth"]["bytes_per_s"]
        assert peak.bytes_source and peak.bytes_source.startswith("measured on the fly")
        assert peak.bandwidth_measured


def test_an_inference_run_checks_once_for_both_phases(tmp_path, monkeypatch, quick_on):
    calls = inject(monkeypatch, DISTURBED)  # refused, so not cached: every later look-up would measure again
    out = tmp_path / "runs"
    assert main(["infer", "--preset", "tiny", "--device", "cpu", "--n-layer", "1", "--prompt-len", "8", "-n", "3",
                 "--steps", "2", "--warmup", "0", "--profile-steps", "1", "--energy", "off", "--no-report",
                 "--no-plots", "--out", str(out)]) == 0
    (folder,) = out.iterdir()
    run = Run.load(folder)
    assert len(calls) == 1  # prefill, decode and the roofline resolve the peak: one check
    for phase in ("prefill", "decode"):
        assert run.value(f"{phase}.mbu") is None and "disturbed" in run.metrics[f"{phase}.mbu"].note
    assert not cache_file(quick_on).exists()


# == a check while other processes competed (issue 49, item 3) ========================================
TICK = 0.01  # the counters' resolution: SC_CLK_TCK = 100


def counters_reading(monkeypatch: pytest.MonkeyPatch, other_ticks: int) -> None:
    """The CPU-time counters around the copy, as the kernel's ticks would read them: a 0.3 s check in
    which this process used 0.3 s of CPU and other processes ``other_ticks`` ticks, on 2 CPUs and 1
    thread. The counters resolve (1 CPU kept busy + 1) ticks / 0.3 s = 0.067 cores; the limit is a
    quarter of the 1 core left free. So 9 ticks (0.30 - 0.067 = 0.233 cores) is quiet, 10 ticks
    (0.333 - 0.067 = 0.267 cores) is busy: the boundary, worked out from the tick alone."""
    from lmprof.hardware import cpu_load

    readings = iter([(0.0, 100.0, 50.0), (0.3, 100.0 + 0.3 + other_ticks * TICK, 50.3)] * 10)

    def snapshot(threads=None):
        wall, machine, own = next(readings)
        return cpu_load.Snapshot(wall_s=wall, machine_busy_s=machine, own_cpu_s=own, loadavg_1m=None, threads=1,
                                 cpus=2, tick_s=TICK)

    monkeypatch.setattr(cpu_load, "snapshot", snapshot)


def check_once(directory: Path):
    from lmprof.hardware import quick_bandwidth

    with quick_bandwidth.allowed():
        check = quick_bandwidth.measure_if_allowed(cpu_model(), 1, directory)
        peak = cal.resolve_peak(cpu_model(), "cpu", "fp32", directory=directory, threads=1)
    return check, peak


def test_a_check_disturbed_by_other_processes_is_used_marked_and_never_cached(monkeypatch, quick_on):
    calls = inject(monkeypatch, STEADY, quiet=False)  # steady copies: only the counters tell
    counters_reading(monkeypatch, other_ticks=10)
    check, peak = check_once(quick_on)
    assert check is not None and check.calibration is not None
    assert check.calibration.disturbed and "other processes kept 0.33 +- 0.07 of 2 cores" in check.calibration.disturbed
    assert "used for this run only and not cached" in check.note
    assert peak.bytes_per_s == pytest.approx(by_hand(STEADY), rel=1e-12)  # this run gets the figure...
    assert "DISTURBED" in (peak.bytes_source or "")  # ...marked
    assert not cache_file(quick_on).exists()  # ...and no later run does
    # a later, quiet run measures again, and its figure is cached
    counters_reading(monkeypatch, other_ticks=9)
    check, peak = check_once(quick_on)
    assert len(calls) == 2 and check is not None and check.calibration is not None
    assert check.calibration.disturbed is None and "cached in" in check.note
    record = json.loads(cache_file(quick_on).read_text())
    assert record["load_check"].startswith("other processes kept 0.30 +- 0.07 of 2 cores")
    assert "DISTURBED" not in (peak.bytes_source or "")


def test_a_cached_check_never_judged_for_load_is_measured_again(monkeypatch, quick_on):
    old = cal.Calibration(device="cpu", device_name=cpu_model(), hostname=socket.gethostname(),
                          created="2026-01-01T00:00:00+00:00", torch="x", threads=1, seconds=0.25,
                          bandwidth={"bytes_per_s": 11.2e9, "nbytes": COPY_BYTES, "n": 10,
                                     "method": "copy (read + write)", "spread": 1.04}, quick=True)
    path = cal.save_calibration(old, quick_on)  # the 11.2 GB/s, cached by an older lmprof
    calls = inject(monkeypatch, STEADY)
    check, peak = check_once(quick_on)
    assert len(calls) == 1 and peak.bytes_per_s == pytest.approx(by_hand(STEADY), rel=1e-12)
    assert json.loads(path.read_text())["bandwidth"]["bytes_per_s"] == pytest.approx(by_hand(STEADY), rel=1e-12)
