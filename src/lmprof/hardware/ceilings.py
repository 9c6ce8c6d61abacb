"""Measuring a device's ceilings: square matmuls per dtype and a large copy, each timed in repeats.

``lmprof calibrate`` (``hardware/calibrate.py``) and a run's quick bandwidth check
(``hardware/quick_bandwidth.py``) time with these, each under :func:`watched`: the CPU-time counters
read around the measurement say whether other processes competed with it (``hardware/cpu_load.py``).
torch is imported inside the functions that measure, never at import.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from lmprof.dtypes import normalize_dtype
from lmprof.errors import ConfigError
from lmprof.hardware import cpu_load

if TYPE_CHECKING:  # torch is imported where a measurement runs
    import torch

T = TypeVar("T")

DEFAULT_SECONDS = {"cpu": 3.0, "cuda": 10.0, "mps": 8.0}
MAX_CALIBRATION_SIZE = 2**16  # square matmul side: 16 GiB per fp32 operand, beyond any sane calibration
# Square matmul sizes tried in order until one takes a good share of the budget.
DEFAULT_SIZES = {"cpu": (128, 256, 512, 1024, 2048), "cuda": (1024, 2048, 4096, 8192), "mps": (512, 1024, 2048, 4096)}
# Copy size for bandwidth: well past the last-level cache so DRAM / HBM is what is measured.
DEFAULT_COPY_BYTES = {"cpu": 128 * 2**20, "cuda": 1024 * 2**20, "mps": 512 * 2**20}
_MIN_SAMPLE_S = 0.004  # below this a single timed call is mostly clock and launch noise


def watched(measure: Callable[[], T], device_kind: str, threads: int) -> tuple[T, cpu_load.OtherLoad | None]:
    """Run ``measure`` between two readings of the CPU-time counters: its result, and how busy other
    processes kept the CPUs meanwhile (None where there are no counters)."""
    before = cpu_load.snapshot(threads)
    result = measure()
    after = cpu_load.snapshot(threads)
    return result, cpu_load.other_load(before, after, device_kind)


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
