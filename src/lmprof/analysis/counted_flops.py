"""MFU from FLOPs torch counted (``FlopCounterMode``) for a model lmprof has no formulas for.

The same metric keys as :func:`lmprof.estimate.mfu.mfu_metrics`, so the summary, the report and
``compare`` read both alike; what differs is said in each figure's source and note: the FLOPs are
*measured* (counted on one real step) rather than estimated, and no byte count exists, so MBU is n/a.
"""
from __future__ import annotations

from lmprof.estimate.mfu import MAX_UTILISATION_PCT, peak_flops_metric
from lmprof.record.catalogue import FLOPS_ACHIEVED, FLOPS_HARDWARE, FLOPS_MODEL, HFU, MBU, MFU, PEAK_FLOPS
from lmprof.record.run import Metric
from lmprof.units import si


def counted_mfu_metrics(flops: float, time_s: float | None, *, where: str, what: str, device_name: str,
                        device_kind: str, dtype: str, beyond: str | None = None) -> dict[str, Metric]:
    """Model FLOPs (counted), achieved FLOP/s, peak, MFU (= HFU: counted FLOPs are what ran) and MBU n/a.

    ``where`` says which step was counted, ``what`` what one count covers ("training step", "prefill", ...).
    ``beyond``: what the counted step ran beyond the model's FLOPs (checkpointed parts of its forward again,
    other models' forwards), so the count is hardware FLOPs only: the model FLOPs, their FLOP/s and MFU are
    n/a with that reason, HFU stands.
    """
    from lmprof.hardware.calibrate import resolve_peak

    out: dict[str, Metric] = {
        FLOPS_MODEL: Metric(value=float(flops), unit="FLOP", source="measured",
                            note=f"FLOPs per {what} counted by torch's FlopCounterMode on {where} "
                                 "(matmuls, convolutions and attention; elementwise ops not counted)"),
        FLOPS_HARDWARE: Metric(value=float(flops), unit="FLOP", source="measured",
                               note="the counted FLOPs: everything the step ran"),
    }
    timed = time_s is not None and time_s > 0
    out[FLOPS_ACHIEVED] = (Metric(value=flops / time_s, unit="FLOP/s", source="derived",
                                  note="counted FLOPs / measured time") if timed and time_s
                           else Metric.na("FLOP/s", "no measured time", source="derived"))
    peak = resolve_peak(device_name, device_kind, dtype)
    out[PEAK_FLOPS] = peak_flops_metric(peak)
    for key in (MFU, HFU):
        if not timed or not time_s:
            out[key] = Metric.na("%", "no measured time", source="derived")
        elif not peak.flops_per_s:
            out[key] = Metric.na("%", peak.note, source="derived")
        elif 100.0 * flops / time_s / peak.flops_per_s > MAX_UTILISATION_PCT:  # the same rule as mfu_metrics
            out[key] = Metric.na("%", f"counted FLOP/s would be {100.0 * flops / time_s / peak.flops_per_s:.0f}% of the "
                                 "peak: the peak is not a ceiling here (rerun `lmprof calibrate` on an idle machine)",
                                 source="derived")
        else:
            out[key] = Metric(value=100.0 * flops / time_s / peak.flops_per_s, unit="%", source="derived",
                              note=f"counted FLOP/s / peak {dtype} FLOP/s ({si(peak.flops_per_s, sep='')}, {peak.source})")
    out[MBU] = Metric.na("%", "bytes moved per step need lmprof's formulas for this model", source="derived")
    if beyond:
        why = (f"the counted step ran more than the model's FLOPs ({beyond}): the count is hardware FLOPs, and lmprof "
               "has no formulas for this model to take that out")
        out[FLOPS_MODEL] = Metric.na("FLOP", why, source="measured")
        out[FLOPS_ACHIEVED] = Metric.na("FLOP/s", why, source="derived")
        out[MFU] = Metric.na("%", why, source="derived")
    return out
