"""Each operator of a trace on a device's roofline: the trace's per-op FLOPs, bytes and device time
(:mod:`lmprof.trace.opflops`) joined with the device's peaks, by :func:`lmprof.estimate.roofline.classify`.

The peak FLOP/s is the one of the operator's dtype, the one it computes in (see
:func:`lmprof.trace.opflops.op_cost`; fp32 operators use the fp32 rate, not TF32: the trace does not
say whether TF32 was allowed). Peaks come in as numbers, so this module reads no
device table; the CLI looks them up (``--device`` or the trace's ``deviceProperties`` name).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from lmprof.estimate.roofline import Bound, classify, ridge_point
from lmprof.trace.opflops import OpFlops


@dataclass(frozen=True)
class OpRooflineRow:
    """One operator (name and input shapes) against the device's ceilings."""

    name: str
    shapes: str
    dtype: str | None
    bound: Bound  # compute-, memory-, overhead-bound, or unknown (no peak for its dtype, no bytes)
    intensity_flop_per_byte: float | None
    ridge_flop_per_byte: float | None  # where the ceilings of its dtype meet
    achieved_flops_per_s: float | None
    peak_flops_per_s: float | None  # of its dtype
    roof_pct: float | None  # achieved over attainable at its intensity


@dataclass(frozen=True)
class OpRoofline:
    """The per-op roofline of one trace."""

    device: str
    peak_bytes_per_s: float | None
    rows: list[OpRooflineRow]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def op_roofline(
    ops: OpFlops | None, device: str, flops_by_dtype: Mapping[str, float], bytes_per_s: float | None
) -> OpRoofline | None:
    """Place every operator row of ``ops`` on the roofline of ``device``; None when the trace has
    no per-op counts or its times are not device times (a CPU-only trace ran on no device)."""
    if ops is None or ops.time_source != "device":
        return None
    rows = []
    for r in ops.rows:
        peak = flops_by_dtype.get(r.dtype) if r.dtype else None
        time_s = r.time_us * 1e-6 if r.time_us > 0 else None
        have = peak is not None and bytes_per_s is not None and r.bytes is not None
        pt = classify(r.name, float(r.flops * r.count), float((r.bytes or 0) * r.count),
                      peak if have else None, bytes_per_s if have else None, time_s=time_s)  # fmt: skip
        rows.append(OpRooflineRow(
            name=r.name, shapes=r.shapes, dtype=r.dtype, bound=pt.bound,
            intensity_flop_per_byte=r.intensity_flop_per_byte,
            ridge_flop_per_byte=ridge_point(peak, bytes_per_s) if have and peak and bytes_per_s else None,
            achieved_flops_per_s=pt.achieved_flops_per_s, peak_flops_per_s=peak,
            roof_pct=None if pt.roof_fraction is None else 100.0 * pt.roof_fraction,
        ))  # fmt: skip
    return OpRoofline(device, bytes_per_s, rows)
