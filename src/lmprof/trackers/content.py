"""What goes to a tracker, the same for every tracker: figures with units, blocks, plots, files, config.

One naming rule for every tracker: a figure is logged as ``<name>_<unit>`` (``step_time_ms``,
``mfu_pct``, ``memory.peak_B``), the unit left off where the name already ends with it
(``tokens_per_s``) or where it is a plain count (``params``). MLflow allows no brackets or ``%`` in
names, so the unit goes into the name in a form every tracker accepts.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmprof.record.run import Run

_UNIT_SLUG = {"%": "pct", "tokens/s": "tokens_per_s", "FLOP/s": "FLOP_per_s", "FLOP/J": "FLOP_per_J",
              "B/s": "B_per_s", "J/token": "J_per_token", "count": ""}
# The block table's columns, in order (run.json's Block fields that a tracker's table shows).
BLOCK_COLUMNS = ("name", "phase", "time_ms", "pct", "spread_ms", "profiled_ms", "calls", "ops", "flops", "bytes")
_ARTIFACT_ROLES = ("trace", "blocks", "ops", "compiled_kernels", "memory_snapshot")


@dataclass(frozen=True)
class Figure:
    """One available figure of a run as a tracker logs it."""

    key: str
    name: str
    value: float
    unit: str
    source: str
    p10: float | None
    p90: float | None
    n: int | None


def unit_slug(unit: str) -> str:
    """The unit as a name suffix: ``%`` -> ``pct``, ``tokens/s`` -> ``tokens_per_s``, ``ms`` -> ``ms``."""
    slug = _UNIT_SLUG.get(unit)
    return slug if slug is not None else re.sub(r"[^A-Za-z0-9]+", "_", unit).strip("_")


def metric_name(key: str, unit: str) -> str:
    """``step_time`` in ms -> ``step_time_ms``; ``tokens_per_s`` stays; names safe for every tracker."""
    slug = unit_slug(unit)
    name = key if not slug or key.endswith(slug) else f"{key}_{slug}"
    return re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", name)


def figures(run: Run) -> list[Figure]:
    """Every figure with a value (n/a figures have none to log), in run.json's order."""
    out = []
    for key, m in run.metrics.items():
        if m.value is None:
            continue
        out.append(Figure(key, metric_name(key, m.unit), float(m.value), m.unit, m.source, m.p10, m.p90, m.n))
    return out


def _name_part(text: str) -> str:
    """One level of a tracker name: what no tracker allows, and ``/`` (a level of its own), as ``_``."""
    return re.sub(r"[^A-Za-z0-9_.\- ]", "_", text) or "_"


def block_scalars(run: Run) -> list[tuple[str, float]]:
    """Each block's time as a scalar a dashboard charts across runs: ``blocks/<block>/<phase>_ms``
    (``time_ms``, the block's share of the clean step), in run.json's order."""
    return [(f"blocks/{_name_part(b.name)}/{_name_part(b.phase)}_ms", float(b.time_ms))
            for b in run.blocks if math.isfinite(b.time_ms)]


def block_rows(run: Run) -> list[list[Any]]:
    """The per-block table, one list per Block in :data:`BLOCK_COLUMNS` order."""
    return [[getattr(b, c) for c in BLOCK_COLUMNS] for b in run.blocks]


def params(run: Run) -> dict[str, str]:
    """The run's config flattened (``model.n_layer``) plus mode, device and run id, as strings."""
    flat: dict[str, str] = {"lmprof.run_id": run.id, "lmprof.mode": run.mode, "lmprof.device": run.env.device,
                            "lmprof.device_name": run.env.device_name}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = "" if value is None else str(value)

    walk("", run.config)
    return flat


def _folder(run: Run) -> Path:
    if run.folder is None:
        raise ValueError("the run has no folder: load it with Run.load(folder)")
    return Path(run.folder)


def plots(run: Run) -> list[Path]:
    """The run's PNG plots that exist on disk (listed in run.files or lying in the folder)."""
    folder = _folder(run)
    listed = [folder / n for n in run.files.values() if n.endswith(".png")]
    found = sorted(folder.glob("*.png"))
    return [p for p in dict.fromkeys([*listed, *found]) if p.is_file()]


def artifacts(run: Run) -> list[Path]:
    """Files a tracker keeps as artifacts: run.json, report.html, the trace, blocks/ops CSVs."""
    folder = _folder(run)
    names = ["run.json", "report.html", *(run.files[r] for r in _ARTIFACT_ROLES if r in run.files)]
    return [p for p in dict.fromkeys(folder / n for n in names) if p.is_file()]


def sweep_points(folder: Path) -> list[Path]:
    """The run folders of a sweep's ok points (``runs/<id>/run.json``), in name order; [] for a run folder."""
    return sorted(p.parent for p in folder.glob("runs/*/run.json"))
