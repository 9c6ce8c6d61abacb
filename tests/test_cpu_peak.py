"""A CPU's peak estimated from cores, clock and vector width: hand-written /proc/cpuinfo files, the
FLOP/s worked out by hand (threads x GHz x FMA units x lanes x 2)."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.hardware import cpu_peak
from lmprof.hardware.calibrate import resolve_peak


def cpuinfo(tmp_path: Path, *, model: str, vendor: str, family: int, flags: str, mhz: str | None = "2445.402") -> Path:
    lines = [f"vendor_id\t: {vendor}", f"cpu family\t: {family}", f"model name\t: {model}"]
    if mhz is not None:
        lines.append(f"cpu MHz\t\t: {mhz}")
    lines += [f"flags\t\t: fpu sse sse2 {flags}", "", "processor\t: 1", "model name\t: other"]
    path = tmp_path / "cpuinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


def facts(tmp_path: Path, max_khz: str | None = None, **kw: object) -> cpu_peak.CpuFacts:
    freq = tmp_path / "max_freq"
    if max_khz is not None:
        freq.write_text(max_khz)
    got = cpu_peak.read_facts(cpuinfo(tmp_path, **kw), freq)  # type: ignore[arg-type]
    assert got is not None
    return got


def test_zen3_avx2_from_cpu_mhz(tmp_path: Path) -> None:
    f = facts(tmp_path, model="AMD EPYC", vendor="AuthenticAMD", family=25, flags="avx avx2 fma")
    flops, how = cpu_peak.estimate(f, 2, "fp32")
    assert flops == pytest.approx(2 * 2.445402e9 * 2 * 8 * 2)  # 156.5 GFLOP/s
    assert how.startswith("estimated from 2 thread(s) x 2.45 GHz (cpu MHz in /proc/cpuinfo, the current clock) x 32 fp32")
    assert cpu_peak.estimate(f, 2, "fp64")[0] == pytest.approx(flops / 2)
    none, why = cpu_peak.estimate(f, 2, "bf16")
    assert none is None and "no native bf16" in why


def test_avx512_width_by_vendor_and_family(tmp_path: Path) -> None:
    zen4 = facts(tmp_path, model="AMD EPYC 9654", vendor="AuthenticAMD", family=25, flags="avx2 fma avx512f avx512_bf16",
                 max_khz="3700000")
    assert cpu_peak.estimate(zen4, 1, "fp32")[0] == pytest.approx(3.7e9 * 2 * 8 * 2)  # 256-bit units
    assert cpu_peak.estimate(zen4, 1, "bf16")[0] == pytest.approx(3.7e9 * 2 * 8 * 2 * 2)
    zen5 = facts(tmp_path, model="AMD EPYC 9755", vendor="AuthenticAMD", family=26, flags="avx2 fma avx512f",
                 max_khz="2700000")
    assert cpu_peak.estimate(zen5, 1, "fp32")[0] == pytest.approx(2.7e9 * 2 * 16 * 2)
    spr = facts(tmp_path, model="Intel Xeon", vendor="GenuineIntel", family=6, flags="avx2 fma avx512f amx_bf16",
                max_khz="2000000")
    assert cpu_peak.estimate(spr, 4, "fp32")[0] == pytest.approx(4 * 2e9 * 64)
    assert cpu_peak.estimate(spr, 4, "bf16")[0] == pytest.approx(4 * 2e9 * 1024)


def test_no_clock_no_estimate(tmp_path: Path) -> None:
    f = facts(tmp_path, model="X", vendor="GenuineIntel", family=6, flags="avx2 fma", mhz=None)
    assert cpu_peak.estimate(f, 1, "fp32") == (None, "no clock known for this CPU (no cpufreq maximum, no cpu MHz in /proc/cpuinfo)")


def test_resolve_peak_uses_the_estimate_for_this_cpu_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = facts(tmp_path, model="Test CPU 9000", vendor="AuthenticAMD", family=25, flags="avx2 fma")
    monkeypatch.setattr(cpu_peak, "read_facts", lambda: f)
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    peak = resolve_peak("Test CPU 9000", "cpu", "fp32", directory=tmp_path / "cache", threads=4)
    assert peak.flops_per_s == pytest.approx(4 * 2.445402e9 * 32) and peak.source == "estimated:cpuinfo"
    assert "estimated from 4 thread(s)" in peak.note and peak.bytes_per_s is None
    assert "MBU and the roofline need `lmprof calibrate`" in peak.note
    other = resolve_peak("Another CPU", "cpu", "fp32", directory=tmp_path / "cache", threads=4)
    assert other.flops_per_s is None  # a run recorded on another machine: this CPU's figures do not apply
