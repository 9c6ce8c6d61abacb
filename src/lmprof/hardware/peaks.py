"""The device table: datasheet dense FLOP/s per dtype, memory bandwidth and memory size, per device.

One table serves the roofline and MFU (peaks) and the fit check of ``lmprof memory`` (nominal and
driver-reported usable memory).

The built-in table is ``peaks.yaml`` beside this module (versioned; every entry names its vendor
source). A user file merges over it, entry by entry:

* ``$LMPROF_PEAKS`` if set (a path), else
* ``$XDG_CONFIG_HOME/lmprof/peaks.yaml`` (default ``~/.config/lmprof/peaks.yaml``) if it exists.

It has the same form (``devices: {key: {name, kind, match, tflops, bandwidth_gbs, source,
memory_gib | memory_gb, usable_mib, memory_source}}``); an
entry whose key exists replaces the fields it gives (``tflops`` merged per dtype), a new key adds a
device. See docs/flops-and-roofline.md.
"""
from __future__ import annotations

import functools

import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from lmprof.dtypes import normalize_dtype
from lmprof.errors import ConfigError
from lmprof.safeyaml import load_file

TFLOP = 1e12
GB = 1e9
GIB = 1024**3
MIB = 1024**2
# Usable / nominal memory assumed when the driver's figure is not recorded: the lowest ratio among
# the cards whose figure is (T4, L4, L40S: 15,360 / 16,384 MiB = 0.9375, ECC reservation on GDDR).
UNRECORDED_USABLE = 0.9375
KINDS = ("cuda", "mps", "cpu")


@dataclass(frozen=True)
class PeakEntry:
    """One device of the table, in base units (FLOP/s, bytes/s)."""

    key: str
    name: str
    kind: str
    flops: Mapping[str, float]  # canonical dtype -> dense FLOP/s
    bytes_per_s: float | None
    source: str
    note: str = ""
    aliases: tuple[str, ...] = ()
    match: tuple[re.Pattern[str], ...] = ()
    origin: str = "built-in"  # or the user file it came from
    memory_bytes: int | None = None  # nominal, as marketed
    usable_bytes: int | None = None  # what the driver reports, where recorded
    memory_source: str = ""

    def usable_memory(self) -> tuple[int | None, str]:
        """(bytes the driver makes available, how that figure was obtained).

        The recorded driver total when the table has one; otherwise :data:`UNRECORDED_USABLE` of
        the nominal memory (the lowest usable/nominal ratio among recorded cards), or None.
        """
        if self.usable_bytes:
            return self.usable_bytes, f"driver-reported total ({self.memory_source})"
        if self.memory_bytes:
            return (int(self.memory_bytes * UNRECORDED_USABLE),
                    f"{UNRECORDED_USABLE:.2%} of nominal {self.memory_bytes / GIB:.1f} GiB: no driver figure "
                    f"recorded ({self.memory_source})")
        return None, "no memory size in the device table"

    def flops_for(self, dtype: object) -> float | None:
        """Dense peak FLOP/s for ``dtype``, or None when the vendor gives none."""
        return self.flops.get(normalize_dtype(dtype))

    def matches(self, device_name: str) -> bool:
        return any(p.search(device_name) for p in self.match)


@dataclass(frozen=True)
class PeakTable:
    """The merged table: built-in entries then user entries, in file order."""

    version: str
    entries: dict[str, PeakEntry]
    files: tuple[str, ...] = field(default=())

    def find(self, device: str, kind: str | None = None) -> PeakEntry | None:
        """The entry for a short name (key or alias) or a torch device name, or None.

        ``kind`` (cuda, mps, cpu) restricts the search to entries of that torch device type, so a
        CPU named "Apple M2" never picks up the M2 GPU's figures.
        """
        text = (device or "").strip()
        if not text:
            return None
        short = _short(text)
        candidates = [e for e in self.entries.values() if kind is None or e.kind == kind]
        for e in candidates:
            if short == _short(e.key) or short in {_short(a) for a in e.aliases}:
                return e
        for e in candidates:
            if e.matches(text):
                return e
        return None

    def gpu_memory(self) -> dict[str, tuple[str, int]]:
        """Short name (key and aliases, lower case) -> (name, nominal bytes) of every GPU with a recorded capacity."""
        out: dict[str, tuple[str, int]] = {}
        for e in self.entries.values():
            if e.kind == "cuda" and e.memory_bytes:
                for short in (e.key, *e.aliases):
                    out[short.lower()] = (e.name, e.memory_bytes)
        return out

    def short_names(self) -> list[str]:
        """Every key and alias, for help texts and error messages."""
        names: list[str] = []
        for e in self.entries.values():
            names.append(e.key)
            names.extend(e.aliases)
        return names


def _short(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def builtin_path() -> Path:
    """Path of the built-in peaks.yaml."""
    return Path(str(resources.files("lmprof.hardware").joinpath("peaks.yaml")))


def user_path() -> Path | None:
    """The user peak file in effect: $LMPROF_PEAKS, else the XDG config one if it exists."""
    env = os.environ.get("LMPROF_PEAKS")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ConfigError(f"LMPROF_PEAKS points to {path}, which is not a file")
        return path
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = base / "lmprof" / "peaks.yaml"
    return path if path.is_file() else None


def load_table(user_file: str | Path | None = None, *, use_user: bool = True) -> PeakTable:
    """The built-in table merged with ``user_file`` (default: :func:`user_path`)."""
    base = _builtin()
    version = str(base.get("version", "?"))
    raw: dict[str, dict[str, Any]] = {k: dict(v, _origin="built-in") for k, v in base["devices"].items()}
    files = [str(builtin_path())]
    path = Path(user_file) if user_file is not None else (user_path() if use_user else None)
    if path is not None:
        user = _read_yaml(path)
        devices = user.get("devices") or {}
        if not isinstance(devices, dict):
            raise ConfigError(f"{path}: 'devices' must be a mapping of device keys to entries")
        for key, entry in devices.items():
            if not isinstance(entry, dict):
                raise ConfigError(f"{path}: device {key!r} must be a mapping")
            merged = dict(raw.get(str(key), {}))
            tflops = dict(merged.get("tflops") or {})
            tflops.update(entry.get("tflops") or {})
            merged.update(entry)
            merged["tflops"] = tflops
            merged.setdefault("source", f"user peak file {path}")
            merged["_origin"] = str(path)
            raw[str(key)] = merged
        version += f"+user({path.name})"
        files.append(str(path))
    entries = {key: _entry(key, e) for key, e in raw.items()}
    return PeakTable(version=version, entries=entries, files=tuple(files))


def find_device(device: str, kind: str | None = None, table: PeakTable | None = None) -> PeakEntry | None:
    """Shortcut for ``load_table().find(device, kind)``."""
    return (table or load_table()).find(device, kind)


@functools.lru_cache(maxsize=1)
def _builtin() -> dict[str, Any]:
    """The shipped table, read once per process (a run looks peaks up several times; the file is
    part of the package, so it cannot change under a running process). Callers copy what they change."""
    return _read_yaml(builtin_path())


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = load_file(path)  # bounded, UTF-8 checked: see lmprof.safeyaml
    except ConfigError as exc:
        raise ConfigError(f"peak file: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"peak file {path} must be a mapping with a 'devices' key")
    return data


def _entry(key: str, e: dict[str, Any]) -> PeakEntry:
    where = f"peak entry {key!r} ({e.get('_origin')})"
    kind = str(e.get("kind", "cuda"))
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    flops: dict[str, float] = {}
    for dtype, value in (e.get("tflops") or {}).items():
        if value is None:
            continue
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: tflops.{dtype} must be a positive number, got {value!r}")
        flops[normalize_dtype(dtype)] = float(value) * TFLOP
    bw = e.get("bandwidth_gbs")
    if bw is not None and (not isinstance(bw, (int, float)) or bw <= 0):
        raise ConfigError(f"{where}: bandwidth_gbs must be a positive number, got {bw!r}")
    try:
        patterns = tuple(re.compile(str(p), re.IGNORECASE) for p in (e.get("match") or ()))
    except re.error as exc:
        raise ConfigError(f"{where}: bad match pattern: {exc}") from None
    nominal = None
    if e.get("memory_gib") is not None:
        nominal = _positive(e["memory_gib"], "memory_gib", where) * GIB
    elif e.get("memory_gb") is not None:
        nominal = _positive(e["memory_gb"], "memory_gb", where) * GB
    usable = e.get("usable_mib")
    usable_bytes = None if usable is None else int(_positive(usable, "usable_mib", where) * MIB)
    source = e.get("source")
    if not source:
        raise ConfigError(f"{where}: every entry needs a 'source' (the datasheet the numbers come from)")
    return PeakEntry(
        key=key,
        name=str(e.get("name", key)),
        kind=kind,
        flops=flops,
        bytes_per_s=None if bw is None else float(bw) * GB,
        source=str(source),
        note=str(e.get("note", "") or ""),
        aliases=tuple(str(a) for a in (e.get("aliases") or ())),
        match=patterns,
        origin=str(e.get("_origin", "built-in")),
        memory_bytes=None if nominal is None else int(nominal),
        usable_bytes=usable_bytes,
        memory_source=str(e.get("memory_source", "") or ""),
    )


def _positive(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)
