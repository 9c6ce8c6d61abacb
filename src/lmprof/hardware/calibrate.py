"""Measured ceilings (``lmprof calibrate``) and the one place that decides which peak to use.

:func:`calibrate` times square matmuls per dtype and a large copy on a device, and caches the
result as JSON in ``$LMPROF_CACHE_DIR`` (default ``~/.cache/lmprof``), one file per host and device.
:func:`resolve_peak` then answers "what is the peak of this device for this dtype": the datasheet
table when it knows the device, else the calibration cache, else (this machine's CPU) an estimate from
its cores and clock, else n/a with the reason. It never invents a number. On CPU, a measured run with
no cached bandwidth measures one on the fly (``hardware/quick_bandwidth.py``), cached here too.

A calibrated figure is what this software stack *achieves* on a large matmul, not what the silicon
could do, so MFU against it reads higher than MFU against a datasheet peak; the source string
always says which one was used.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lmprof import safejson
from lmprof.atomic import write_text
from lmprof.dtypes import normalize_dtype
from lmprof.errors import ConfigError, DataError
from lmprof.hardware.peaks import PeakTable, load_table

if TYPE_CHECKING:  # torch is imported where a measurement runs
    import torch

SCHEMA = "lmprof.calibration/1"
DEFAULT_SECONDS = {"cpu": 3.0, "cuda": 10.0, "mps": 8.0}
MAX_CALIBRATION_SIZE = 2**16  # square matmul side: 16 GiB per fp32 operand, beyond any sane calibration
# Square matmul sizes tried in order until one takes a good share of the budget.
DEFAULT_SIZES = {"cpu": (128, 256, 512, 1024, 2048), "cuda": (1024, 2048, 4096, 8192), "mps": (512, 1024, 2048, 4096)}
# Copy size for bandwidth: well past the last-level cache so DRAM / HBM is what is measured.
DEFAULT_COPY_BYTES = {"cpu": 128 * 2**20, "cuda": 1024 * 2**20, "mps": 512 * 2**20}
_MIN_SAMPLE_S = 0.004  # below this a single timed call is mostly clock and launch noise
#: p90 / p10 of a measurement's repeats above this: something else ran while calibrating, and the
#: figure (a median of disturbed repeats) would understate the device, so every MFU above it overstates.
SPREAD_LIMIT = 1.25
#: How a bandwidth measured by a run's quick check (not by `lmprof calibrate`) is labelled.
ON_THE_FLY = "measured on the fly"
#: 1-minute load average at or above this share of the CPUs: the machine was busy.
BUSY_LOAD_SHARE = 0.5
#: Cores other processes kept busy while calibrating (measured by the caller), as a share of the
#: cores the calibration's threads left free, above which they competed with it.
OTHER_CORES_LIMIT = 0.25


@dataclass(frozen=True)
class Peak:
    """The ceilings to compare a run against, and where they came from.

    ``source`` is ``"table:<entry>"``, ``"calibrated:<file>"``, ``"estimated:cpuinfo"`` or None (nothing
    known); when the bandwidth came from somewhere else than the FLOP/s, ``bytes_source`` says so (a
    quick check's starts with :data:`ON_THE_FLY`).
    """

    flops_per_s: float | None
    bytes_per_s: float | None
    source: str | None
    note: str
    dtype: str = "fp32"
    device: str = ""
    bytes_source: str | None = None

    @property
    def available(self) -> bool:
        return self.flops_per_s is not None

    @property
    def bandwidth_measured(self) -> bool:
        """Whether the bandwidth was measured on this machine (a calibration or a quick check), not a datasheet's."""
        return (self.bytes_source or self.source or "").startswith(("calibrated:", ON_THE_FLY))

    @property
    def ridge(self) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the compute and bandwidth ceilings meet."""
        if self.flops_per_s is None or not self.bytes_per_s:
            return None
        return self.flops_per_s / self.bytes_per_s


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


def _rate(v: object) -> bool:
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
    if data.get("disturbed") is not None and not isinstance(data.get("disturbed"), str):
        return "field disturbed must be a string or null"
    if not isinstance(data.get("quick", False), bool):
        return "field quick must be true or false"
    for key in ("loadavg", "loadavg_after"):
        if data.get(key) is not None and (not isinstance(data.get(key), (int, float)) or isinstance(data.get(key), bool)):
            return f"field {key} must be a number or null"
    matmul, bandwidth = data.get("matmul", {}), data.get("bandwidth", {})
    if not isinstance(matmul, dict) or not all(isinstance(m, dict) for m in matmul.values()):
        return "field matmul must map dtypes to objects"
    for dt, m in matmul.items():
        if not _rate(m.get("flops_per_s")):
            return f"field matmul.{dt}.flops_per_s must be a positive number"
    if not isinstance(bandwidth, dict):
        return "field bandwidth must be an object"
    if "bytes_per_s" in bandwidth and bandwidth["bytes_per_s"] is not None and not _rate(bandwidth["bytes_per_s"]):
        return "field bandwidth.bytes_per_s must be a positive number"
    return None


# -- resolving a peak -------------------------------------------------------------------------------


def resolve_peak(
    device_name: str,
    kind: str | None = None,
    dtype: object = "fp32",
    *,
    directory: str | Path | None = None,
    table: PeakTable | None = None,
    threads: int | None = None,
) -> Peak:
    """The peak FLOP/s (for ``dtype``) and bandwidth of a device: table, else calibration, else (this
    machine's CPU) an estimate from its cores, clock and vector width, else n/a.

    The bandwidth of this machine's CPU, when nothing is cached, is measured on the fly only inside
    :func:`lmprof.hardware.quick_bandwidth.allowed` (a measured run's figures, after its timed and
    profiled windows); everywhere else (``lmprof roofline``, ``lmprof memory``) nothing is measured.

    ``device_name`` is torch's name ("NVIDIA H100 80GB HBM3") or a short name ("h100"); ``kind`` is
    the torch device type (cpu, cuda, mps) or None for "any". A table entry lacking the dtype (bf16
    on a V100) falls back to a calibration of that dtype if there is one.
    """
    dt = normalize_dtype(dtype)
    table = table or load_table()
    entry = table.find(device_name, kind)
    flops = bw = None
    flops_src = bw_src = None
    notes: list[str] = []
    if entry is not None:
        flops = entry.flops_for(dt)
        bw = entry.bytes_per_s
        where = "" if entry.origin == "built-in" else f" from {entry.origin}"
        if flops is not None:
            flops_src = f"table:{entry.key}"
            notes.append(f"{entry.name} dense {dt} datasheet peak ({entry.source}){where}")
        else:
            notes.append(f"the peak table's {entry.name} has no {dt} rate")
        if bw is not None:
            bw_src = f"table:{entry.key}"
        if entry.note:
            notes.append(entry.note)
    if flops is None or bw is None:
        if threads is None and kind in ("cpu", None):
            import torch  # lazy, like the rest of this module: reading a peak needs no torch otherwise

            threads = torch.get_num_threads()  # a CPU ceiling holds for this process's thread count
        cal = load_calibration(device_name, kind, directory, notes, threads=threads)
        if cal is not None:
            if flops is None and cal.flops_for(dt) is not None:
                flops = cal.flops_for(dt)
                flops_src = f"calibrated:{cal.path}"
                m = cal.matmul[dt]
                notes.append(
                    f"achieved {dt} matmul throughput measured by lmprof calibrate on {cal.created[:10]} "
                    f"(n={m.get('size')}), not a datasheet peak"
                )
            if bw is None and cal.bytes_per_s is not None:
                bw = cal.bytes_per_s
                if cal.quick:
                    bw_src = on_the_fly_source(cal)
                    notes.append(f"bandwidth from a measured run's quick copy check on {cal.created[:10]}, cached in "
                                 f"{cal.path}")
                else:
                    bw_src = f"calibrated:{cal.path}"
                    notes.append("bandwidth measured by lmprof calibrate (copy, read + write counted)")
    this_cpu = False
    if flops is None and kind == "cpu":
        # Last resort for this machine's own CPU: cores x clock x vector width (hardware/cpu_peak.py).
        from lmprof.hardware import cpu_peak

        facts = cpu_peak.read_facts()
        if facts is not None and facts.model and facts.model == device_name:
            if threads is None:
                import torch

                threads = torch.get_num_threads()
            flops, how = cpu_peak.estimate(facts, threads, dt)
            flops_src = "estimated:cpuinfo" if flops else None
            notes.append(how)
            this_cpu = True
    if bw is None and kind == "cpu":
        from lmprof.hardware import quick_bandwidth

        # None outside a measured run's figures (lmprof roofline, lmprof memory): nothing is measured there.
        quick = quick_bandwidth.measure_if_allowed(device_name, threads, directory)
        if quick is not None:
            notes.append(quick.note)  # where the bandwidth was cached, or why there is none: said once
            if quick.calibration is not None:
                bw = quick.calibration.bytes_per_s
                bw_src = on_the_fly_source(quick.calibration)
        elif this_cpu:
            notes.append("no memory bandwidth known (it cannot be read off a CPU, and no calibration or quick check "
                         "of a measured run is cached): MBU and the roofline need `lmprof calibrate`")
    if flops is None and bw is None:
        what = f"{device_name!r}" + (f" ({kind})" if kind else "")
        reason = (
            f"no peak known for {what} {dt}: not in the peak table (version {table.version}) and no calibration "
            f"cached in {Path(directory or cache_dir())}; run `lmprof calibrate"
            + (f" --device {kind}" if kind else "")
            + f" --dtypes {dt}` or add the device to a user peaks.yaml"
        )
        return Peak(None, None, None, "; ".join(notes + [reason]) if notes else reason, dt, device_name)
    if flops is None:
        fix = ("add the figure to a user peaks.yaml" if dt == "fp8"
               else f"run `lmprof calibrate --dtypes {dt}` for a measured one")
        notes.append(f"no {dt} FLOP/s peak, so MFU is n/a: {fix}")
    source = flops_src if flops_src else None
    return Peak(
        flops_per_s=flops,
        bytes_per_s=bw,
        source=source,
        note="; ".join(notes),
        dtype=dt,
        device=device_name,
        bytes_source=bw_src if bw_src != flops_src else None,
    )


def on_the_fly_source(cal: Calibration) -> str:
    """The bandwidth source of a quick check: what was measured, how steady, and what it is not."""
    bw = cal.bandwidth
    nbytes = bw.get("nbytes")
    size = f"{nbytes / 2**20:.0f} MiB" if isinstance(nbytes, (int, float)) and nbytes >= 2**20 else f"{nbytes} bytes"
    spr = bw.get("spread")
    steady = f", p90/p10 spread {100 * (spr - 1):.0f}% over {bw.get('n')} copies" if spr and _rate(spr) else ""
    return (f"{ON_THE_FLY} (quick bandwidth check, {size} copied{steady}), not a datasheet figure; "
            "`lmprof calibrate` for a full one")


# -- measuring --------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16, "fp64": torch.float64}[name]


def _timed(fn: Callable[[], object], sync: Callable[[], None], budget_s: float, max_samples: int = 200) -> list[float]:
    """Seconds per call of ``fn``: one warm-up call excluded, device synchronized around each sample.

    Each sample times ``k`` back-to-back calls (k chosen so a sample lasts at least a few ms) and
    divides, so tiny calls are not swamped by clock and launch overhead.
    """
    sync()
    t0 = time.perf_counter()
    fn()  # warm-up: allocations, kernel selection, caches; never counted
    sync()
    once = max(time.perf_counter() - t0, 1e-9)
    k = max(1, math.ceil(_MIN_SAMPLE_S / once))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_samples and (len(samples) < 3 or time.perf_counter() < deadline):
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / k)
    return samples


def spread(samples: Sequence[float]) -> float:
    """p90 / p10 of repeated timings (1.0 for fewer than 3): how much the repeats disagree."""
    if len(samples) < 3:
        return 1.0
    qs = statistics.quantiles(samples, n=10)
    return qs[-1] / qs[0] if qs[0] > 0 else math.inf


def measure_matmul(
    device: Any, dtype: str, *, budget_s: float, sizes: Sequence[int] | None = None
) -> dict[str, Any]:
    """Achievable FLOP/s of ``n x n @ n x n`` matmuls (2·n³ FLOPs each) in ``dtype`` on ``device``.

    Sizes are tried from small to large while the budget lasts; the result is the best size's median.
    """
    import torch

    from lmprof.hardware.devices import synchronizer

    dt = normalize_dtype(dtype)
    tdev = torch.device(device)
    if dt == "fp8":
        raise ConfigError("fp8 matmul calibration is not supported (it needs scaled matmuls); use the peak table")
    if dt == "tf32" and tdev.type != "cuda":
        raise ConfigError("tf32 is a CUDA tensor-core mode; calibrate fp32 on this device instead")
    if dt == "fp64" and tdev.type == "mps":
        raise ConfigError("MPS has no fp64")
    sizes = tuple(sizes or DEFAULT_SIZES.get(tdev.type, DEFAULT_SIZES["cuda"]))
    sync = synchronizer(tdev)
    by_size: dict[str, dict[str, float]] = {}
    best: tuple[float, int, int] | None = None
    started = time.perf_counter()
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if tdev.type == "cuda" else None
    try:
        if tdev.type == "cuda":
            # fp32 means true fp32 (what the table's fp32 figure is); tf32 turns tensor cores on.
            torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        for i, n in enumerate(sizes):
            left = budget_s - (time.perf_counter() - started)
            if left <= 0 and best is not None:
                break
            share = max(left, 0.0) / (len(sizes) - i)
            a = torch.randn(n, n, device=tdev, dtype=_torch_dtype(dt))
            b = torch.randn(n, n, device=tdev, dtype=_torch_dtype(dt))
            out = torch.empty(n, n, device=tdev, dtype=_torch_dtype(dt))

            def matmul(a: torch.Tensor = a, b: torch.Tensor = b, out: torch.Tensor = out) -> torch.Tensor:
                return torch.matmul(a, b, out=out)  # this size's tensors, bound now (the loop moves on)

            samples = _timed(matmul, sync, share)
            med = statistics.median(samples)
            flops = 2.0 * n**3 / med
            by_size[str(n)] = {"flops_per_s": flops, "seconds": med, "n": len(samples), "spread": spread(samples)}
            if best is None or flops > best[0]:
                best = (flops, n, len(samples))
            del a, b, out, matmul  # matmul's defaults hold the tensors too: all freed before the next size
            if i + 1 < len(sizes):
                # Predict the next size from the best rate so far (a small size can be slowed down
                # by thread start-up or a busy machine, which says little about bigger ones); stop
                # when its warm-up + 3 samples would not fit in what is left.
                nxt = 2.0 * sizes[i + 1] ** 3 / best[0]
                if nxt * 4 > budget_s - (time.perf_counter() - started):
                    break
    finally:
        if prev_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    assert best is not None
    return {"flops_per_s": best[0], "size": best[1], "n": best[2], "spread": by_size[str(best[1])]["spread"],
            "by_size": by_size}


def measure_bandwidth(device: Any, *, budget_s: float, nbytes: int | None = None) -> dict[str, Any]:
    """Memory bandwidth from a large ``dst.copy_(src)``: bytes read + bytes written per second."""
    import torch

    from lmprof.hardware.devices import synchronizer

    tdev = torch.device(device)
    nbytes = int(nbytes or DEFAULT_COPY_BYTES.get(tdev.type, DEFAULT_COPY_BYTES["cuda"]))
    numel = max(1, nbytes // 4)
    src = torch.ones(numel, device=tdev, dtype=torch.float32)
    dst = torch.empty_like(src)
    samples = _timed(lambda: dst.copy_(src), synchronizer(tdev), budget_s)
    med = statistics.median(samples)
    moved = 2 * numel * 4  # every byte is read once and written once
    return {"bytes_per_s": moved / med, "nbytes": numel * 4, "method": "copy (read + write)", "n": len(samples),
            "spread": spread(samples)}


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # Windows has no load average
        return None


def busy_warning(cal: Calibration) -> str | None:
    """A sentence when other processes were using the CPUs as calibration started or ended, else None."""
    loads = [x for x in (cal.loadavg, cal.loadavg_after) if x is not None]
    if not loads or not cal.cpu_count:
        return None
    if max(loads) >= BUSY_LOAD_SHARE * cal.cpu_count:
        return (f"the machine was busy (load average {max(loads):g} on {cal.cpu_count} CPUs): other work "
                "slows these figures down")
    return None


def disturbed_reason(cal: Calibration, other_cores: float | None = None) -> str | None:
    """Why ``cal`` was taken on a disturbed machine, or None: repeats that disagree by more than
    :data:`SPREAD_LIMIT` (p90/p10), a busy load average, or (``other_cores``, measured by the caller
    over the calibration) other processes keeping cores busy."""
    reasons = [f"{dt} matmul repeats vary {m['spread']:.2f}x (p90/p10; limit {SPREAD_LIMIT:g}x)"
               for dt, m in cal.matmul.items() if _rate(m.get("spread")) and m["spread"] > SPREAD_LIMIT]
    bw = cal.bandwidth.get("spread")
    if isinstance(bw, (int, float)) and _rate(bw) and bw > SPREAD_LIMIT:
        reasons.append(f"copy repeats vary {bw:.2f}x (p90/p10; limit {SPREAD_LIMIT:g}x)")
    busy = busy_warning(cal)
    if busy:
        reasons.append(busy)
    free = max((cal.cpu_count or 1) - (cal.threads if cal.device == "cpu" else 0), 1)
    if other_cores is not None and other_cores > OTHER_CORES_LIMIT * free:
        reasons.append(f"other processes kept {other_cores:.2f} of {cal.cpu_count} cores busy while calibrating")
    return "; ".join(reasons) or None


def calibrate(
    device: str = "cpu",
    dtypes: Sequence[str] = ("fp32", "bf16"),
    *,
    seconds: float | None = None,
    sizes: Sequence[int] | None = None,
    copy_bytes: int | None = None,
    directory: str | Path | None = None,
    save: bool = True,
) -> Calibration:
    """Measure matmul FLOP/s per dtype and copy bandwidth on ``device``; cache and return them.

    ``seconds`` is the total budget (default 3 s on CPU, 10 s on CUDA), split evenly between the
    dtypes and the bandwidth test; each measurement still takes at least 3 samples after warm-up.
    A calibration whose repeats disagree or that ran on a busy machine (:func:`disturbed_reason`)
    has ``disturbed`` set and is not saved.
    """
    import torch

    from lmprof import gc_hold
    from lmprof.hardware.devices import resolve_device

    gc_hold.release()  # measured as any Python process would run it (lmprof/gc_hold.py)

    dev = resolve_device(device)
    wanted = [normalize_dtype(d) for d in dtypes]
    if not wanted:
        raise ConfigError("give at least one dtype to calibrate")
    total = float(seconds if seconds is not None else DEFAULT_SECONDS.get(dev.kind, 5.0))
    if not (math.isfinite(total) and 0 < total <= 86400):
        raise ConfigError(f"--seconds must be a positive number of seconds up to a day (86400), got {total}")
    if sizes is not None and any(not 0 < n <= MAX_CALIBRATION_SIZE for n in sizes):
        raise ConfigError(f"--sizes must be between 1 and {MAX_CALIBRATION_SIZE:,} (a square matmul of that size "
                          "needs gigabytes per operand)")
    share = total / (len(wanted) + 1)
    cal = Calibration(
        device=dev.kind,
        device_name=dev.name,
        hostname=socket.gethostname(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        seconds=total,
        loadavg=_loadavg(),
        cpu_count=os.cpu_count(),
    )
    for dt in wanted:
        cal.matmul[dt] = measure_matmul(dev.torch_device, dt, budget_s=share, sizes=sizes)
    cal.bandwidth = measure_bandwidth(dev.torch_device, budget_s=share, nbytes=copy_bytes)
    cal.loadavg_after = _loadavg()
    cal.disturbed = disturbed_reason(cal)
    if save and cal.disturbed is None:  # a disturbed calibration is refused: it would overstate every MFU
        save_calibration(cal, directory)
    return cal
