"""An estimate as run-record metrics and the ``memory`` table (estimated next to measured), and byte formatting."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from lmprof.estimate.memory.result import MemoryEstimate
from lmprof.modes import traits
from lmprof.record.catalogue import MEMORY_PARTS, lookup, memory_key

if TYPE_CHECKING:
    from lmprof.record.catalogue import MetricSpec
    from lmprof.record.run import Metric


class MeasuredMemory(Protocol):
    """What the table needs of a measurement (lmprof.measure.memory.MeasuredMemory, which imports torch)."""

    def value(self, key: str) -> tuple[float | None, str | None]: ...


# The estimate's attribute each memory part reads (record/keys.py: MEMORY_PARTS).
_KEYS = {
    "params": "params",
    "grads": "grads",
    "optimizer": "optimizer_state",
    "activations": None,  # saved tensors (+ held logits): what the forward pass leaves alive
    "kv_cache": "kv_cache",
    "peak": "peak",
}


def parts_of(mode: str) -> tuple[str, ...]:
    """The memory parts a run of ``mode`` has figures for (the catalogue's modes of ``memory.<part>``), in
    the table's order: params, grads, optimizer, activations and peak in training; params, kv_cache, peak."""
    return tuple(k for k in MEMORY_PARTS if mode in _spec(memory_key(k)).modes)


def _spec(key: str) -> "MetricSpec":
    spec = lookup(key)
    assert spec is not None, f"{key} is not in the metric catalogue"
    return spec


def _estimated_value(est: MemoryEstimate, key: str) -> int:
    if key == "activations":
        if not traits(est.mode).trains:
            return 0
        return est.activations + (est.logits if est.hold_logits else 0)
    return int(getattr(est, str(_KEYS[key])))


def memory_metrics(estimate: MemoryEstimate, measured: "MeasuredMemory | None" = None) -> dict[str, "Metric"]:
    """Run-record metrics: ``memory.<x>`` (measured, n/a with a reason when not) and ``memory.estimated.<x>``.

    Keys: params, grads, optimizer, activations, kv_cache, peak. ``memory.activations`` is the
    bytes the forward pass allocated and still holds at its end (held logits included).
    """
    from lmprof.record.run import Metric

    out: dict[str, Metric] = {}
    for key in parts_of(estimate.mode):
        out[memory_key(key, estimated=True)] = Metric(
            value=float(_estimated_value(estimate, key)), unit="B", source="estimated",
            note=_estimate_note(estimate, key),
        )
        out[memory_key(key)] = _measured_metric(measured, key)
    return out


def _estimate_note(est: MemoryEstimate, key: str) -> str | None:
    if key == "peak":
        return f"peak at {est.peak_at}; {est.regime}"
    if key == "activations":
        held = " + held logits" if est.hold_logits else ""
        path = {"fused": "fused attention kernel", "math": "attention scores kept (math kernel)"}.get(est.attention_path,
                                                                                                   est.attention_path)
        drop = f", dropout masks (up to p={est.dropout:g})" if est.dropout else ""
        return f"saved for backward{held}: {path}{drop} (Korthikanti et al. 2022, adapted)"
    if key == "optimizer":
        return est._optimizer_note()
    return None


def _measured_metric(measured: "MeasuredMemory | None", key: str) -> "Metric":
    from lmprof.record.run import Metric

    if measured is None:
        return Metric.na("B", "memory was not measured in this run")
    value, note = measured.value(key)
    if value is None:
        return Metric.na("B", note or "not measurable here")
    return Metric(value=float(value), unit="B", source="measured", note=note)


def memory_table(estimate: MemoryEstimate, measured: "MeasuredMemory | None" = None) -> list[dict[str, Any]]:
    """Rows for ``Run.tables["memory"]``: category, measured_bytes, estimated_bytes, diff_pct, note.

    ``diff_pct`` is (measured - estimated) / estimated in percent, None when either is missing.
    """
    rows: list[dict[str, Any]] = []
    for key in parts_of(estimate.mode):
        est = _estimated_value(estimate, key)
        meas, note = (None, "not measured") if measured is None else measured.value(key)
        diff = None
        if meas is not None and est:
            diff = round(100.0 * (meas - est) / est, 2)
        rows.append({
            "category": key,
            "measured_bytes": None if meas is None else int(meas),
            "estimated_bytes": int(est),
            "diff_pct": diff,
            "note": note or _estimate_note(estimate, key) or "",
        })
    return rows


def format_bytes(n: float | None) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    if n is None:
        return "n/a"
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(abs(n), 1024)), 4)
    return f"{n / 1024 ** exp:.2f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][exp]}"
