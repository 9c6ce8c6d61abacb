"""``lmprof calibrate``'s measurement: this machine's achievable matmul FLOP/s and memory bandwidth.

:func:`calibrate` times square matmuls per dtype and a large copy on a device
(``hardware/ceilings.py``), reads the load average and the CPU-time counters around them, and
caches the result unless the machine was disturbed (``hardware/calibration.py``). Which peak a
figure then uses is decided in ``hardware/resolve.py``.

The names other modules import from here are re-exported below: the record and its cache, the
measuring functions and the peak resolution each live in their own module, and this one imports
them; none of them imports this one (the quick bandwidth check measures with ``ceilings.py``).
"""
from __future__ import annotations

import math
import os
import socket
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from lmprof.dtypes import normalize_dtype
from lmprof.errors import ConfigError
from lmprof.hardware.calibration import (
    BUSY_LOAD_SHARE as BUSY_LOAD_SHARE,
    SCHEMA as SCHEMA,
    SPREAD_LIMIT as SPREAD_LIMIT,
    Calibration as Calibration,
    busy_warning as busy_warning,
    cache_dir as cache_dir,
    cache_path as cache_path,
    disturbed_reason as disturbed_reason,
    load_calibration as load_calibration,
    load_check as load_check,
    read_calibration as read_calibration,
    save_calibration as save_calibration,
)
from lmprof.hardware.ceilings import (
    DEFAULT_COPY_BYTES as DEFAULT_COPY_BYTES,
    DEFAULT_SECONDS as DEFAULT_SECONDS,
    DEFAULT_SIZES as DEFAULT_SIZES,
    MAX_CALIBRATION_SIZE as MAX_CALIBRATION_SIZE,
    measure_bandwidth as measure_bandwidth,
    measure_matmul as measure_matmul,
    spread as spread,
    watched as watched,
)
from lmprof.hardware.resolve import (
    ON_THE_FLY as ON_THE_FLY,
    Peak as Peak,
    on_the_fly_source as on_the_fly_source,
    resolve_peak as resolve_peak,
)


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # Windows has no load average
        return None


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
    A calibration whose repeats disagree or that ran on a busy machine (:func:`disturbed_reason`:
    the load average, and the CPU-time counters read around the whole measurement) has
    ``disturbed`` set and is not saved.
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

    def measure() -> None:
        for dt in wanted:
            cal.matmul[dt] = measure_matmul(dev.torch_device, dt, budget_s=share, sizes=sizes)
        cal.bandwidth = measure_bandwidth(dev.torch_device, budget_s=share, nbytes=copy_bytes)

    _, load = watched(measure, dev.kind, cal.threads)
    cal.loadavg_after = _loadavg()
    cal.load_check = load_check(load)
    cal.disturbed = disturbed_reason(cal, load)
    if save and cal.disturbed is None:  # a disturbed calibration is refused: it would overstate every MFU
        save_calibration(cal, directory)
    return cal
