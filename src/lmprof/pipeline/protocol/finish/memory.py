"""Attach the memory breakdown (measured beside estimated) and the timeline plot to a run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lmprof.estimate.memory import MemoryEstimate, format_bytes, memory_metrics, memory_table, parts_of
from lmprof.measure.held import Held
from lmprof.measure.memory import MeasuredMemory
from lmprof.record.catalogue import memory_key
from lmprof.record.run import Metric, Run


def add_memory(run: Run, folder: Path, measured: MeasuredMemory | None, estimate: MemoryEstimate | None,
               title: str, plots: bool = True) -> None:
    """Fill ``memory.*`` metrics, ``tables["memory"]``, the timeline PNG and the CUDA snapshot file."""
    from lmprof.show.memory_plot import plot_memory_timeline

    if estimate is not None:
        run.metrics.update(memory_metrics(estimate, measured))
        run.tables["memory"] = memory_table(estimate, measured)
    elif measured is not None:  # a module lmprof has no formulas for: measured figures only
        for key in parts_of(run.mode):
            value, note = measured.value(key)
            run.metrics[memory_key(key)] = (Metric(value=float(value), unit="B", source="measured", note=note)
                                            if value is not None else Metric.na("B", note or "not measurable here"))
        if not any("no memory estimate" in n for n in run.notes):  # a note said why already
            run.notes.append("no memory formulas for this module: memory figures are measured only")
    if measured is None:
        return
    note = held_note(measured, estimate)
    if note:
        run.notes.append(note)
    run.tables["memory_measured"] = [_jsonable(measured.to_dict())]
    run.notes.extend(measured.notes)
    if measured.timeline is not None and plots:
        path = plot_memory_timeline(measured.timeline, folder / "memory.png", title,
                                    estimate.peak if estimate is not None else None)
        run.files["memory_timeline"] = Path(path).name
    if measured.snapshot_path:
        run.files["memory_snapshot"] = Path(measured.snapshot_path).name


def held_logits(measured: MeasuredMemory | None, batch: int, seq_len: int, vocab: int) -> Held | None:
    """The model's (batch, seq, vocab) logits among the tensors the loop kept alive into backward, if so."""
    for h in (measured.held or []) if measured is not None else []:
        if tuple(h.shape) in ((batch, seq_len, vocab), (batch * seq_len, vocab)):
            return h
    return None


def held_note(measured: MeasuredMemory, estimate: MemoryEstimate | None) -> str | None:
    """Why measured activations exceed what autograd saves: the tensors the model returned that the loop
    kept alive into backward (measure/held.py), with their bytes, and what the estimate makes of them."""
    held = measured.held or []
    if not held:
        return None
    total = sum(h.bytes for h in held)
    parts = "; ".join(f"{h.name} {list(h.shape)} {h.dtype} = {' x '.join(map(str, h.shape))} x "
                      f"{h.bytes // max(1, _numel(h.shape))} B = {format_bytes(h.bytes)}" for h in held)
    if estimate is None:
        counted = ""
    elif estimate.hold_logits:
        counted = ("; the estimate counts the logits as held too (as `lmprof memory --hold-logits` does); a loop "
                   "that keeps only the loss (loss = model(...).loss) frees them before backward")
    else:
        counted = "; the estimate counts only what autograd saves, so it is below the measured figures by these bytes"
    return (f"memory: the loop keeps tensors the model returned alive into backward, beyond what autograd saved "
            f"({format_bytes(total)}, in the measured activations and peak): {parts}{counted}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v)) for k, v in d.items()}
