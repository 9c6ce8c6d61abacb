"""A calibration's record and its cache: what ``lmprof calibrate`` (and a run's quick bandwidth check)
measured, where it is kept, and whether it may be used.

One JSON file per host and device in ``$LMPROF_CACHE_DIR`` (default ``~/.cache/lmprof``). A record
taken on a disturbed machine (:func:`disturbed_reason`: repeats that disagree, a busy load average,
other processes' CPU time beyond the counters' resolution, ``hardware/cpu_load.py``) is never saved
and, if found in a cache, never used. Measuring is ``hardware/ceilings.py``; choosing which peak a
figure uses, ``hardware/resolve.py``.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmprof import safejson
from lmprof.atomic import write_text
from lmprof.dtypes import normalize_dtype
from lmprof.errors import DataError
from lmprof.hardware.cpu_load import OtherLoad

SCHEMA = "lmprof.calibration/1"
#: p90 / p10 of a measurement's repeats above this: something else ran while calibrating, and the
#: figure (a median of disturbed repeats) would understate the device, so every MFU above it overstates.
SPREAD_LIMIT = 1.25
#: 1-minute load average at or above this share of the CPUs: the machine was busy.
BUSY_LOAD_SHARE = 0.5


@dataclass
class Calibration:
    """One ``lmprof calibrate`` result, as cached on disk."""

    device: str  # torch device type: cpu, cuda, mps
    device_name: str
    hostname: str
    created: str
    torch: str
    threads: int
    seconds: float
    loadavg: float | None = None  # 1-minute load average before measuring: other work skews the figures
    cpu_count: int | None = None
    matmul: dict[str, dict[str, Any]] = field(default_factory=dict)  # dtype -> {flops_per_s, size, n, spread, by_size}
    bandwidth: dict[str, Any] = field(default_factory=dict)  # {bytes_per_s, nbytes, method, n}
    path: str | None = None
    schema: str = SCHEMA
    loadavg_after: float | None = None
    # Why this calibration was taken on a disturbed machine (None: it was not); a disturbed one is
    # never saved by `lmprof calibrate` and never used for MFU if found in a cache.
    disturbed: str | None = None
    # A measured run's quick bandwidth check (hardware/quick_bandwidth.py): bandwidth only, no matmul;
    # `lmprof calibrate` replaces it, and `lmprof calibrate --if-missing` does not count it.
    quick: bool = False
    # What the CPU-time counters said of other processes while measuring (hardware/cpu_load.py), in
    # words. None: a record made before lmprof judged it; a quick check without it is measured again.
    load_check: str | None = None

    def flops_for(self, dtype: str) -> float | None:
        entry = self.matmul.get(normalize_dtype(dtype))
        return None if entry is None else entry.get("flops_per_s")

    @property
    def bytes_per_s(self) -> float | None:
        return self.bandwidth.get("bytes_per_s")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path", None)
        return d


# -- cache ------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$LMPROF_CACHE_DIR`` or ``$XDG_CACHE_HOME/lmprof`` (default ``~/.cache/lmprof``)."""
    env = os.environ.get("LMPROF_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lmprof"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "unknown"


def cache_path(device_name: str, kind: str, directory: str | Path | None = None, hostname: str | None = None) -> Path:
    """Where the calibration of ``device_name`` (a ``kind`` device) on this host is cached."""
    host = _slug(hostname or socket.gethostname())
    return Path(directory or cache_dir()) / f"calibration-{host}-{_slug(kind)}-{_slug(device_name)}.json"


def save_calibration(cal: Calibration, directory: str | Path | None = None) -> Path:
    path = cache_path(cal.device_name, cal.device, directory, cal.hostname)
    write_text(path, json.dumps(cal.to_dict(), indent=2))
    cal.path = str(path)
    return path


def load_calibration(
    device_name: str, kind: str | None = None, directory: str | Path | None = None,
    notes: list[str] | None = None, threads: int | None = None,
) -> Calibration | None:
    """The cached calibration of this device on this host, or None.

    With ``kind`` None every kind is tried (the first cached one wins). A cache file that cannot be
    read (truncated, wrong types, another schema) is ignored, never fatal: a calibration is a
    convenience, and a finished run must not be lost over it; why it was ignored goes to ``notes``.
    A CPU calibration is used only by a run with the same number of threads (``threads``): a
    1-thread run measured against a 2-thread ceiling would report half its real MFU.
    """
    kinds = [kind] if kind else ["cuda", "mps", "cpu"]
    for k in kinds:
        path = cache_path(device_name, k, directory)
        if path.is_file():
            try:
                cal = read_calibration(path)
            except DataError as exc:
                if notes is not None:
                    notes.append(f"ignored the calibration cache: {exc} (rerun `lmprof calibrate` to replace it)")
                continue
            if cal.quick and cal.load_check is None:
                if notes is not None:
                    notes.append(f"the cached quick bandwidth check {path} was taken without judging other processes' "
                                 "load (an older lmprof): not used, so a measured run checks again")
                continue
            disturbed = cal.disturbed or disturbed_reason(cal)
            if disturbed:
                if notes is not None:
                    notes.append(f"ignored the cached calibration {path}: taken on a disturbed machine ({disturbed}); "
                                 "rerun `lmprof calibrate` on an idle machine")
                continue
            if k == "cpu" and threads is not None and cal.threads != threads:
                if notes is not None:
                    what = "quick bandwidth check" if cal.quick else "CPU calibration"
                    notes.append(f"the {what} was taken with {cal.threads} thread(s) and this run uses "
                                 f"{threads}: not comparable, so not used (run `lmprof calibrate` with "
                                 f"OMP_NUM_THREADS={threads})")
                continue
            return cal
    return None


def read_calibration(path: str | Path) -> Calibration:
    """Read one calibration file; anything but a well-formed one is a DataError naming what is wrong."""
    path = Path(path)
    try:
        data = safejson.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"cannot read calibration {path}: {exc.strerror or exc}") from None
    except safejson.JSONError as exc:  # not JSON, not UTF-8, nested too deeply
        raise DataError(f"cannot read calibration {path}: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is not an lmprof calibration (not a JSON object)")
    if data.get("schema") != SCHEMA:
        raise DataError(f"{path} is not an lmprof calibration (schema={str(data.get('schema'))[:40]!r})")
    problem = _calibration_problem(data)
    if problem:
        raise DataError(f"{path} is not a valid lmprof calibration: {problem}")
    known = {f for f in Calibration.__dataclass_fields__ if f != "path"}
    cal = Calibration(**{k: v for k, v in data.items() if k in known})
    cal.path = str(path)
    return cal


def is_rate(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _calibration_problem(data: dict[str, Any]) -> str | None:
    """What makes a calibration dict unusable (None when it is fine): the fields peaks are read from."""
    for key in ("device", "device_name", "hostname", "created", "torch"):
        if not isinstance(data.get(key), str):
            return f"field {key} must be a string"
    for key in ("threads",):
        if not isinstance(data.get(key), int) or isinstance(data.get(key), bool):
            return f"field {key} must be an integer"
    if not isinstance(data.get("seconds"), (int, float)) or isinstance(data.get("seconds"), bool):
        return "field seconds must be a number"
    for key in ("disturbed", "load_check"):
        if data.get(key) is not None and not isinstance(data.get(key), str):
            return f"field {key} must be a string or null"
    if not isinstance(data.get("quick", False), bool):
        return "field quick must be true or false"
    for key in ("loadavg", "loadavg_after"):
        if data.get(key) is not None and (not isinstance(data.get(key), (int, float)) or isinstance(data.get(key), bool)):
            return f"field {key} must be a number or null"
    matmul, bandwidth = data.get("matmul", {}), data.get("bandwidth", {})
    if not isinstance(matmul, dict) or not all(isinstance(m, dict) for m in matmul.values()):
        return "field matmul must map dtypes to objects"
    for dt, m in matmul.items():
        if not is_rate(m.get("flops_per_s")):
            return f"field matmul.{dt}.flops_per_s must be a positive number"
    if not isinstance(bandwidth, dict):
        return "field bandwidth must be an object"
    if "bytes_per_s" in bandwidth and bandwidth["bytes_per_s"] is not None and not is_rate(bandwidth["bytes_per_s"]):
        return "field bandwidth.bytes_per_s must be a positive number"
    return None


# -- judging ----------------------------------------------------------------------------------------


def busy_warning(cal: Calibration) -> str | None:
    """A sentence when other processes were using the CPUs as calibration started or ended, else None."""
    loads = [x for x in (cal.loadavg, cal.loadavg_after) if x is not None]
    if not loads or not cal.cpu_count:
        return None
    if max(loads) >= BUSY_LOAD_SHARE * cal.cpu_count:
        return (f"the machine was busy (load average {max(loads):g} on {cal.cpu_count} CPUs): other work "
                "slows these figures down")
    return None


def disturbed_reason(cal: Calibration, load: OtherLoad | None = None) -> str | None:
    """Why ``cal`` was taken on a disturbed machine, or None: repeats that disagree by more than
    :data:`SPREAD_LIMIT` (p90/p10), a busy load average, or (``load``, read by the CPU-time counters
    over the measurement) other processes keeping cores busy beyond the counters' resolution."""
    reasons = [f"{dt} matmul repeats vary {m['spread']:.2f}x (p90/p10; limit {SPREAD_LIMIT:g}x)"
               for dt, m in cal.matmul.items() if is_rate(m.get("spread")) and m["spread"] > SPREAD_LIMIT]
    bw = cal.bandwidth.get("spread")
    if isinstance(bw, (int, float)) and is_rate(bw) and bw > SPREAD_LIMIT:
        reasons.append(f"copy repeats vary {bw:.2f}x (p90/p10; limit {SPREAD_LIMIT:g}x)")
    busy = busy_warning(cal)
    if busy:
        reasons.append(busy)
    if load is not None and load.busy:
        reasons.append(f"other processes kept {load.reading()} busy while measuring (limit {load.limit:.2g})")
    return "; ".join(reasons) or None


def load_check(load: OtherLoad | None) -> str:
    """What a calibration record says of other processes' load while it was measured, in words."""
    if load is None:
        return "no CPU-time counters on this system: other processes' load not read"
    if not load.judgeable:
        return load.too_short()
    return f"other processes kept {load.reading()} busy over {load.window_s:.2f} s (limit {load.limit:.2g})"
