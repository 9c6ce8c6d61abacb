"""Attach the memory breakdown (measured beside estimated) and the timeline plot to a run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lmprof.estimate.memory import MemoryEstimate, memory_metrics, memory_table
from lmprof.measure.memory import MeasuredMemory
from lmprof.record.run import Metric, Run

MEASURED_KEYS = ("params", "grads", "optimizer", "activations", "kv_cache", "peak")


def add_memory(run: Run, folder: Path, measured: MeasuredMemory | None, estimate: MemoryEstimate | None,
               title: str, plots: bool = True) -> None:
    """Fill ``memory.*`` metrics, ``tables["memory"]``, the timeline PNG and the CUDA snapshot file."""
    from lmprof.show.memory_plot import plot_memory_timeline

    if estimate is not None:
        run.metrics.update(memory_metrics(estimate, measured))
        run.tables["memory"] = memory_table(estimate, measured)
    elif measured is not None:  # a module lmprof has no formulas for: measured figures only
        skip = {"grads", "optimizer", "activations"} if run.mode == "infer" else {"kv_cache"}
        for key in MEASURED_KEYS:
            if key in skip:
                continue
            value, note = measured.value(key)
            run.metrics[f"memory.{key}"] = (Metric(value=float(value), unit="B", source="measured", note=note)
                                            if value is not None else Metric.na("B", note or "not measurable here"))
        run.notes.append("no memory formulas for this module: memory figures are measured only")
    if measured is None:
        return
    run.tables["memory_measured"] = [_jsonable(measured.to_dict())]
    run.notes.extend(measured.notes)
    if measured.timeline is not None and plots:
        path = plot_memory_timeline(measured.timeline, folder / "memory.png", title,
                                    estimate.peak if estimate is not None else None)
        run.files["memory_timeline"] = Path(path).name
    if measured.snapshot_path:
        run.files["memory_snapshot"] = Path(measured.snapshot_path).name


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v)) for k, v in d.items()}
