"""The roofline model over plain numbers: intensity, attainable and achieved FLOP/s, bound labels.

For a block with F FLOPs and Q bytes on a device with compute ceiling P (FLOP/s) and bandwidth ceiling
W (bytes/s):

* arithmetic intensity ``I = F / Q`` (FLOP/byte);
* ridge point ``I* = P / W``: the intensity where the two ceilings meet;
* attainable FLOP/s ``min(P, I·W)`` and the roofline time ``max(F / P, Q / W)``;
* with a measured time t: achieved FLOP/s ``F / t`` and the fraction of the roof reached,
  ``max(F / t / P, Q / t / W)`` (the same as achieved / attainable, and still defined when F = 0).

Labels:

* ``overhead-bound``: measured, and under ``overhead_threshold`` (default 10%) of the roof at its
  intensity: far below both ceilings, so launches, Python, synchronisation or tiny shapes dominate;
* ``compute-bound``: ``I >= I*``;
* ``memory-bound``: ``I < I*``;
* ``unknown``: no ceilings (no peak known).

Pure functions: no torch, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Literal, Protocol

Bound = Literal["compute-bound", "memory-bound", "overhead-bound", "unknown"]
DEFAULT_OVERHEAD_THRESHOLD = 0.10


@dataclass(frozen=True)
class RooflinePoint:
    """One block on the roofline."""

    name: str
    phase: str
    flops: float
    bytes: float
    intensity: float  # FLOP/byte; inf when bytes == 0
    bound: Bound
    attainable_flops_per_s: float | None  # min(P, I·W)
    min_time_s: float | None  # max(F/P, Q/W): the roofline's best time
    time_s: float | None = None  # measured
    achieved_flops_per_s: float | None = None
    achieved_bytes_per_s: float | None = None
    roof_fraction: float | None = None  # achieved / attainable, in [0, 1] unless the peak is wrong

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def intensity(flops: float, nbytes: float) -> float:
    """FLOP per byte; inf for FLOPs with no bytes, 0 for neither."""
    if nbytes <= 0:
        return math.inf if flops > 0 else 0.0
    return flops / nbytes


def ridge_point(peak_flops: float, peak_bytes_per_s: float) -> float:
    """Intensity (FLOP/byte) at which the compute and bandwidth ceilings meet."""
    _check_ceilings(peak_flops, peak_bytes_per_s)
    return peak_flops / peak_bytes_per_s


def attainable(intensity_: float, peak_flops: float, peak_bytes_per_s: float) -> float:
    """Roofline bound ``min(P, I·W)`` in FLOP/s."""
    _check_ceilings(peak_flops, peak_bytes_per_s)
    if math.isinf(intensity_):
        return peak_flops
    return min(peak_flops, intensity_ * peak_bytes_per_s)


def roofline_time(flops: float, nbytes: float, peak_flops: float, peak_bytes_per_s: float) -> float:
    """Least time the roofline allows: ``max(F / P, Q / W)`` seconds."""
    _check_ceilings(peak_flops, peak_bytes_per_s)
    return max(flops / peak_flops, nbytes / peak_bytes_per_s)


def classify(
    name: str,
    flops: float,
    nbytes: float,
    peak_flops: float | None,
    peak_bytes_per_s: float | None,
    *,
    time_s: float | None = None,
    phase: str = "",
    overhead_threshold: float = DEFAULT_OVERHEAD_THRESHOLD,
) -> RooflinePoint:
    """Place one block on the roofline and label it (see the module docstring for the rules).

    Without ``time_s`` (analytic) the label is compute- or memory-bound by intensity alone.
    """
    if flops < 0 or nbytes < 0:
        raise ValueError(f"{name}: FLOPs and bytes must be >= 0, got {flops}, {nbytes}")
    if not 0 <= overhead_threshold < 1:
        raise ValueError(f"overhead_threshold must be in [0, 1), got {overhead_threshold}")
    if time_s is not None and time_s <= 0:
        time_s = None  # a zero or negative time is no measurement
    i = intensity(flops, nbytes)
    achieved = None if time_s is None else flops / time_s
    achieved_bw = None if time_s is None else nbytes / time_s
    if not peak_flops or not peak_bytes_per_s:
        return RooflinePoint(name, phase, flops, nbytes, i, "unknown", None, None, time_s, achieved, achieved_bw)
    ridge = ridge_point(peak_flops, peak_bytes_per_s)
    roof = attainable(i, peak_flops, peak_bytes_per_s)
    best = roofline_time(flops, nbytes, peak_flops, peak_bytes_per_s)
    bound: Bound = "compute-bound" if i >= ridge else "memory-bound"
    fraction = None
    if time_s is not None:
        fraction = max(flops / time_s / peak_flops, nbytes / time_s / peak_bytes_per_s)
        if fraction < overhead_threshold:
            bound = "overhead-bound"
    return RooflinePoint(name, phase, flops, nbytes, i, bound, roof, best, time_s, achieved, achieved_bw, fraction)


def _check_ceilings(peak_flops: float, peak_bytes_per_s: float) -> None:
    if not peak_flops or peak_flops <= 0 or not peak_bytes_per_s or peak_bytes_per_s <= 0:
        raise ValueError(f"ceilings must be positive, got {peak_flops} FLOP/s and {peak_bytes_per_s} B/s")


@dataclass(frozen=True)
class PhaseRoofline:
    """Blocks of one phase on one device: costs, roofline points and their sum."""

    batch: int
    tokens: int  # new tokens processed (batch x 1 for decode)
    flops: float
    bytes: float
    time_s: float  # sum of each block's roofline time (blocks run one after another)
    points: tuple[RooflinePoint, ...]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s if self.time_s else 0.0

    @property
    def bound(self) -> str:
        """compute-bound when blocks at the compute roof take most of the time, else memory-bound."""
        compute = sum(p.min_time_s or 0.0 for p in self.points if p.bound == "compute-bound")
        return "compute-bound" if compute >= self.time_s / 2 else "memory-bound"


class Cost(Protocol):
    """What the roofline needs of a block's cost (lmprof.estimate.flops.BlockCost is one)."""

    @property
    def name(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def flops(self) -> float: ...
    @property
    def bytes(self) -> float: ...


def phase_roofline(costs: Iterable[Cost], batch: int, tokens: int, peak_flops: float | None,
                   peak_bytes_per_s: float | None) -> PhaseRoofline:
    """Classify every block cost and add up their roofline times (without ceilings: bound unknown, time 0)."""
    points = tuple(classify(c.name, c.flops, c.bytes, peak_flops, peak_bytes_per_s, phase=c.phase) for c in costs)
    return PhaseRoofline(
        batch=batch, tokens=tokens, flops=sum(p.flops for p in points), bytes=sum(p.bytes for p in points),
        time_s=sum(p.min_time_s or 0.0 for p in points), points=points,
    )
