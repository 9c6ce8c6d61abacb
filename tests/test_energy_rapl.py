"""RAPL meter against a fake powercap folder: zone discovery, wrap-around, permissions, missing interface."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.measure.energy.base import UnavailableMeter
from lmprof.measure.energy.rapl import RaplMeter, rapl_meters, read_text


class FakeClock:
    def __init__(self, t: float = 10.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_zone(root: Path, dirname: str, name: str, energy_uj: int = 0, max_uj: int = 262_143_328_850) -> Path:
    zone = root / dirname
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


@pytest.fixture()
def powercap(tmp_path: Path) -> Path:
    """A two-socket Intel server as /sys/class/powercap shows it (flat list of zone links)."""
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", 1_000)
    make_zone(root, "intel-rapl:0:0", "core", 500)
    make_zone(root, "intel-rapl:0:1", "dram", 2_000)
    make_zone(root, "intel-rapl:1", "package-1", 3_000)
    make_zone(root, "intel-rapl:1:0", "dram", 4_000)
    make_zone(root, "intel-rapl-mmio:0", "package-0", 1_000)  # MMIO view of package 0: a duplicate
    (root / "dtpm").mkdir()  # another control type, not RAPL
    return root


def test_discovers_packages_and_dram_only(powercap: Path) -> None:
    meters = rapl_meters(powercap)
    assert [m.domain for m in meters] == ["cpu-package-0", "dram-0", "cpu-package-1", "dram-1"]
    assert all(isinstance(m, RaplMeter) and m.probe().ok for m in meters)


def test_psys_and_core_are_not_metered(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "package-0")
    make_zone(tmp_path, "intel-rapl:0:0", "core")
    make_zone(tmp_path, "intel-rapl:1", "psys")
    assert [m.domain for m in rapl_meters(tmp_path)] == ["cpu-package-0"]


def test_exact_energy_in_microjoules(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 7_000_000)
    clock = FakeClock()
    meter = RaplMeter(zone, domain="cpu-package-0", clock=clock)
    assert meter.probe().ok
    meter.begin()
    (zone / "energy_uj").write_text("19500000\n")  # +12.5 J
    clock.t += 0.25
    win = meter.end()
    assert win.joules == 12.5
    assert win.seconds == 0.25
    assert win.watts == 50.0
    assert win.note is None


def test_counter_wrap_is_corrected_exactly(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000)
    clock = FakeClock()
    meter = RaplMeter(zone, domain="cpu-package-0", clock=clock)
    assert meter.probe().ok
    meter.begin()
    (zone / "energy_uj").write_text("150000\n")  # 100_000 uJ to the wrap, then 150_000 more
    clock.t += 0.001
    win = meter.end()
    assert win.joules == 0.25
    assert win.note and "wrapped" in win.note


def test_long_window_flags_possible_double_wrap(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 0, max_uj=1_000_000)  # 1 J range
    clock = FakeClock()
    meter = RaplMeter(zone, domain="cpu-package-0", clock=clock)
    assert meter.probe().ok
    meter.begin()
    clock.t += 60.0
    assert "more than once" in (meter.end().note or "")


def test_permission_error_is_unavailable_with_the_fix(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0")

    def root_only(path: Path) -> str:
        # What a non-root read of energy_uj does on kernels patched for CVE-2020-8694.
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path)

    meters = rapl_meters(tmp_path, read=root_only)
    assert [m.domain for m in meters] == ["cpu-package-0"]
    avail = meters[0].probe()
    assert not avail.ok
    assert "permission denied" in avail.reason
    assert "root" in avail.reason and "chmod" in avail.reason
    assert str(zone / "energy_uj") in avail.reason


def test_unreadable_counter_file_is_unavailable(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0")
    (zone / "energy_uj").unlink()
    (zone / "energy_uj").mkdir()  # reading a directory fails even as root
    avail = RaplMeter(zone, domain="cpu-package-0").probe()
    assert not avail.ok and "cannot read" in avail.reason


def test_garbage_counter_is_unavailable(tmp_path: Path) -> None:
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0")
    (zone / "energy_uj").write_text("n/a\n")
    avail = RaplMeter(zone, domain="cpu-package-0").probe()
    assert not avail.ok and "integer" in avail.reason


def test_missing_powercap_folder_is_unavailable(tmp_path: Path) -> None:
    meters = rapl_meters(tmp_path / "no-such-powercap")
    assert len(meters) == 1 and isinstance(meters[0], UnavailableMeter)
    avail = meters[0].probe()
    assert not avail.ok and "no RAPL powercap interface" in avail.reason


def test_powercap_without_rapl_zones_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "dtpm").mkdir()
    avail = rapl_meters(tmp_path)[0].probe()
    assert not avail.ok and "no RAPL package zone" in avail.reason


def test_amd_zen_layout_package_without_dram(tmp_path: Path) -> None:
    # AMD Zen through intel_rapl_msr: same names, a package zone with a core subzone, no DRAM.
    make_zone(tmp_path, "intel-rapl:0", "package-0", max_uj=65_535_999_984)
    make_zone(tmp_path, "intel-rapl:0:0", "core")
    assert [m.domain for m in rapl_meters(tmp_path)] == ["cpu-package-0"]
