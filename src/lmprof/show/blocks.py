"""The per-block table as rows and phase columns, shared by the terminal summary and the report."""
from __future__ import annotations

from collections import defaultdict

from lmprof.names import FORWARD_BLOCKS, PHASES, STEP_ROWS, folded
from lmprof.record.run import Run


def block_cells(run: Run) -> tuple[list[str], list[str], dict[str, dict[str, float]], dict[str, float]]:
    """(row keys in display order, phases, ms per row and phase, share per row)."""
    cells: dict[str, dict[str, float]] = defaultdict(dict)
    pct: dict[str, float] = defaultdict(float)
    for b in run.blocks:
        name = folded(b.name)  # per-layer rows of models without block rules: one row for all layers
        key = name if b.phase != "step" else f"step:{name}"
        cells[key][b.phase] = cells[key].get(b.phase, 0.0) + b.time_ms
        pct[key] += b.pct
    phases = [p for p in PHASES if any(b.phase == p for b in run.blocks)]
    order = [b for b in FORWARD_BLOCKS if b in cells]
    order += sorted(k for k in cells if k not in FORWARD_BLOCKS and not k.startswith("step:")
                    and k not in ("accumulate_grad", "other"))
    order += [k for k in ("accumulate_grad", "other") if k in cells]
    order += [f"step:{s}" for s in STEP_ROWS if f"step:{s}" in cells]
    order += sorted(k for k in cells if k.startswith("step:") and k not in order)
    return order, phases, cells, pct


def row_label(key: str) -> str:
    if key == "step:other":
        return "other (step)"
    return key.removeprefix("step:")


