"""Turn an :class:`EnergyResult` into run-record metrics, each with its unit and source.

Keys (record/keys.py: ``energy_key``; an estimate's are ``energy.estimated.*``, so measured and
estimated figures never share a key)::

    energy.total                 J          measured   all counted domains over the window
    energy.window                s          measured   window length (measured results only)
    energy.power.avg             W          derived    total / window
    energy.power.idle            W          measured   idle baseline of the same domains
    energy.above_idle            J          derived    total - idle power x window
    energy.per_step              J/step     derived    total / steps   (inference: per_generation)
    energy.per_token             J/token    derived    total / tokens  (inference: per_generated_token)
    energy.flop_per_joule        FLOP/J     derived    flops / total  (= FLOP/s per W)
    energy.domain.<domain>       J          measured   one domain, e.g. energy.domain.gpu:0
"""
from __future__ import annotations

import re

from lmprof.measure.energy.monitor import EnergyResult
from lmprof.modes import Mode, traits
from lmprof.record.catalogue import energy_key
from lmprof.record.run import Metric, Source


def _slug(unit: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", unit.lower()).strip("_") or "unit"


def energy_metrics(
    result: EnergyResult,
    *,
    steps: int,
    tokens: float | None = None,
    flops: float | None = None,
    mode: Mode = "train",
) -> dict[str, Metric]:
    """Metrics for one measured window.

    ``steps``, ``tokens`` and ``flops`` are totals over the window the monitor measured (not per
    step): e.g. 20 training steps of 8x512 tokens give ``steps=20, tokens=81920``. The mode names the
    units: training steps and tokens (``energy.per_step``, ``energy.per_token``), or generations and
    generated tokens (``energy.per_generation``, ``energy.per_generated_token``). Per-step, per-token and
    FLOP/J figures use the total energy (idle included), which is what the work cost; ``above_idle``
    shows the part the work added. ``off`` gives no metrics; a result with no reading gives n/a
    entries with the reason.
    """
    if result.mode == "off":
        return {}
    estimated = result.mode == "estimate" or result.source == "estimated"
    step_unit, token_unit = traits(mode).unit, traits(mode).token

    def key(part: str) -> str:
        return energy_key(part, estimated)

    measured: Source = "estimated" if estimated else "measured"
    derived: Source = "estimated" if estimated else "derived"
    out: dict[str, Metric] = {}

    if not result.available:
        out[key("total")] = Metric.na("J", result.explanation().removeprefix("energy: n/a — "), measured)
        for d in result.domains:
            out[key(f"domain.{d.domain}")] = Metric.na("J", d.reason or "not available", measured)
        return out

    total = result.total_joules
    seconds = result.seconds or 0.0
    assert total is not None
    note = result.coverage()
    if result.missing:
        note += f"; not included (n/a): {result.unavailable_reasons()}"
    if estimated:
        models = {d.note for d in result.counted if d.note}
        note = "; ".join([note, *sorted(models)])
    out[key("total")] = Metric(value=total, unit="J", source=measured, note=note)
    if not estimated:
        out[key("window")] = Metric(value=seconds, unit="s", source="measured", note="measured energy window")

    avg = result.average_watts
    out[key("power.avg")] = (
        Metric(value=avg, unit="W", source=derived) if avg is not None else Metric.na("W", "zero-length window", derived)
    )
    idle_w = result.idle_watts
    if idle_w is None:
        if result.idle_seconds is None:
            why = "idle baseline not measured (call EnergyMonitor.measure_idle before warm-up)"
        else:
            failed = [d.note for d in result.counted if d.idle_w is None and d.note]
            why = "; ".join(failed) or "idle baseline missing for some domains"
        out[key("power.idle")] = Metric.na("W", why, measured)
        out[key("above_idle")] = Metric.na("J", why, derived)
    else:
        idle_note = f"over {result.idle_seconds:.3g} s before the run" if result.idle_seconds else "modelled"
        out[key("power.idle")] = Metric(value=idle_w, unit="W", source=measured, note=idle_note)
        out[key("above_idle")] = Metric(value=result.above_idle_joules, unit="J", source=derived)

    out[key(f"per_{_slug(step_unit)}")] = (Metric(value=total / steps, unit=f"J/{step_unit}", source=derived)
                                            if steps > 0 else Metric.na(f"J/{step_unit}", "no measured steps", derived))
    if tokens is not None:
        out[key(f"per_{_slug(token_unit)}")] = (
            Metric(value=total / tokens, unit=f"J/{token_unit}", source=derived)
            if tokens > 0 else Metric.na(f"J/{token_unit}", f"no {token_unit}s in the window", derived)
        )
    if flops is not None:
        out[key("flop_per_joule")] = (
            Metric(value=flops / total, unit="FLOP/J", source=derived, note="= FLOP/s per W")
            if total > 0 else Metric.na("FLOP/J", "zero energy read in the window", derived)
        )

    for d in result.domains:
        extra = f"{d.meter} {d.method}" + (f"; {d.note}" if d.note else "") + ("" if d.in_total else "; not in total")
        out[key(f"domain.{d.domain}")] = (Metric(value=d.joules, unit="J", source=measured, note=extra) if d.available
                                          else Metric.na("J", d.reason or "not available", measured))
    return out


def energy_summary_line(result: EnergyResult) -> str:
    """The one line the summary prints, e.g. ``energy: n/a — no RAPL powercap interface ...``."""
    return result.explanation()
