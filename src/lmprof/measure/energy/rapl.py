"""CPU package and DRAM energy from RAPL, through Linux powercap sysfs.

Layout (Intel, and AMD Zen too: the kernel's ``intel_rapl_msr`` driver serves both, under the
same ``intel-rapl`` names; AMD shows package and core zones but no DRAM zone)::

    /sys/class/powercap/intel-rapl:0/         name = "package-0"   energy_uj, max_energy_range_uj
    /sys/class/powercap/intel-rapl:0:0/       name = "core"        (inside the package: not summed)
    /sys/class/powercap/intel-rapl:0:1/       name = "dram"        (separate from the package)
    /sys/class/powercap/intel-rapl:1/         name = "psys"        (whole platform: overlaps, skipped)

``energy_uj`` counts **microjoules** and wraps to 0 after ``max_energy_range_uj``; one wrap per
window is corrected, and the counter is refreshed about every millisecond. Since the PLATYPUS fix
(CVE-2020-8694) ``energy_uj`` is readable by root only on most distributions.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from lmprof.measure.energy.base import (Availability, Clock, EnergyMeter, EnergyWindow, MeterError, UnavailableMeter,
                                        WindowClock)

POWERCAP_ROOT = Path("/sys/class/powercap")
UJ_PER_J = 1e6
# Control types that expose RAPL zones; the MMIO one duplicates the MSR package on some Intel
# client parts, so it is used only for packages the MSR interface does not show.
_PREFIXES = ("intel-rapl", "intel-rapl-mmio")
_ZONE_RE = re.compile(r"^(?P<prefix>[a-z-]+):(?P<pkg>\d+)(?::(?P<sub>\d+))?$")
# Above this power the counter could wrap twice in one window without us noticing.
_WRAP_GUARD_W = 500.0

Reader = Callable[[Path], str]


def read_text(path: Path) -> str:
    """Read a sysfs file (the one filesystem boundary of this module; tests replace it)."""
    return path.read_text()


def _fix_for(path: Path) -> str:
    return (
        f"cannot read {path}: permission denied (energy_uj is root-only on kernels patched for "
        "CVE-2020-8694); run as root, or allow reads until reboot with "
        f"`sudo chmod a+r {path.parent.parent}/*/energy_uj`"
    )


class RaplMeter(EnergyMeter):
    """One RAPL zone (a CPU package or its DRAM) read from ``<zone>/energy_uj``."""

    name = "rapl"
    update_period_s = 0.001  # RAPL status registers update roughly every millisecond

    def __init__(self, zone: Path, *, domain: str, read: Reader = read_text, clock: Clock = time.monotonic) -> None:
        self.zone = zone
        self.domain = domain
        self._read = read
        self._max_uj: int | None = None
        self._start_uj: int | None = None
        self._window = WindowClock(clock, "RaplMeter")

    def _read_int(self, fname: str) -> int:
        return int(self._read(self.zone / fname).strip())

    def probe(self) -> Availability:
        """Read the counter and its range once; report permission problems with the fix."""
        for fname in ("max_energy_range_uj", "energy_uj"):
            path = self.zone / fname
            try:
                value = self._read_int(fname)
            except PermissionError:
                return Availability(False, _fix_for(path))
            except FileNotFoundError:
                return Availability(False, f"{path} is missing")
            except OSError as exc:
                return Availability(False, f"cannot read {path}: {exc.strerror or exc}")
            except ValueError:
                return Availability(False, f"{path} does not hold an integer")
            if fname == "max_energy_range_uj":
                if value <= 0:
                    return Availability(False, f"{path} is {value}: counter range unknown")
                self._max_uj = value
        return Availability(True, f"RAPL {self.zone.name}")

    def begin(self) -> None:
        if self._max_uj is None:
            raise MeterError("RaplMeter.begin() before a successful probe()")
        self._start_uj = self._read_int("energy_uj")
        self._window.start()

    def end(self) -> EnergyWindow:
        if self._start_uj is None or not self._window.running or self._max_uj is None:
            raise MeterError("RaplMeter.end() without begin()")
        end_uj = self._read_int("energy_uj")
        seconds = self._window.stop().seconds
        delta = end_uj - self._start_uj
        self._start_uj = None
        note = None
        if delta < 0:
            # The counter passed max_energy_range_uj and restarted from zero once.
            delta += self._max_uj
            note = "counter wrapped once (corrected)"
        if seconds * _WRAP_GUARD_W > self._max_uj / UJ_PER_J:
            note = (
                f"window {seconds:.0f} s is long enough for the counter (range "
                f"{self._max_uj / UJ_PER_J:.0f} J) to wrap more than once: energy may be undercounted"
            )
        return EnergyWindow(joules=delta / UJ_PER_J, seconds=seconds, method="counter", note=note)


def _zone_dirs(root: Path) -> list[tuple[str, int, int | None, Path]]:
    found = []
    for path in root.iterdir():
        m = _ZONE_RE.match(path.name)
        if m and m["prefix"] in _PREFIXES:
            sub = None if m["sub"] is None else int(m["sub"])
            found.append((m["prefix"], int(m["pkg"]), sub, path))
    # MSR interface first so the MMIO duplicates are recognised and dropped.
    found.sort(key=lambda z: (_PREFIXES.index(z[0]), z[1], -1 if z[2] is None else z[2]))
    return found


def rapl_meters(root: Path = POWERCAP_ROOT, *, read: Reader = read_text, clock: Clock = time.monotonic) -> list[EnergyMeter]:
    """One meter per CPU package and per DRAM zone under ``root``.

    Core, uncore and psys zones are skipped: the first two are parts of the package and psys
    overlaps everything, so none of them can be added to a total. Without any RAPL zone the list
    holds one :class:`UnavailableMeter` saying so, so callers always get a reason.
    """
    if not root.is_dir():
        return [UnavailableMeter("rapl", "cpu", f"no RAPL powercap interface on this machine ({root} not found)")]
    meters: list[EnergyMeter] = []
    seen: set[str] = set()
    for _prefix, pkg, _sub, path in _zone_dirs(root):
        try:
            zone_name = read(path / "name").strip()
        except OSError:
            continue  # a zone without a readable name is not one we can label
        if zone_name.startswith("package"):
            number = zone_name.partition("-")[2] or str(pkg)
            domain = f"cpu-package-{number}"
        elif zone_name == "dram":
            domain = f"dram-{pkg}"
        else:
            continue
        if domain in seen:
            continue  # the MMIO view of a package the MSR interface already gave
        seen.add(domain)
        meters.append(RaplMeter(path, domain=domain, read=read, clock=clock))
    if not meters:
        return [UnavailableMeter("rapl", "cpu", f"no RAPL package zone under {root}")]
    return meters
