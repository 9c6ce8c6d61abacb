"""The per-block table as rows and phase columns, shared by the terminal summary and the report."""
from __future__ import annotations

from collections import defaultdict

from lmprof.names import FORWARD_BLOCKS, OTHER_MODELS, PHASE_ROWS, PHASES, STEP_ROWS, folded
from lmprof.record.run import Run


def block_cells(run: Run) -> tuple[list[str], list[str], dict[str, dict[str, float]], dict[str, float]]:
    """(row keys in display order, phases, ms per row and phase, share per row)."""
    cells: dict[str, dict[str, float]] = defaultdict(dict)
    pct: dict[str, float] = defaultdict(float)
    for b in run.blocks:
        name = folded(b.name)  # per-layer rows of models without block rules: one row for all layers
        # the other models' forwards are one row wherever they ran (a phase's, or between phases: its total)
        key = name if b.phase != "step" or name == OTHER_MODELS else f"step:{name}"
        cells[key][b.phase] = cells[key].get(b.phase, 0.0) + b.time_ms
        pct[key] += b.pct
    phases = [p for p in PHASES if any(b.phase == p for b in run.blocks)]
    order = [b for b in FORWARD_BLOCKS if b in cells]
    order += sorted(k for k in cells if k not in FORWARD_BLOCKS and not k.startswith("step:")
                    and k not in PHASE_ROWS)
    order += [k for k in PHASE_ROWS if k in cells]
    order += [f"step:{s}" for s in STEP_ROWS if f"step:{s}" in cells]
    order += sorted(k for k in cells if k.startswith("step:") and k not in order)
    return order, phases, cells, pct


def row_label(key: str) -> str:
    if key == "step:other":
        return "other (step)"
    return key.removeprefix("step:")


def block_table(run: Run) -> tuple[list[str], list[list[str]], list[str]]:
    """The per-block table as text: headers; a row per block with its ms per phase, total ms, share and (a
    compiled run) the ms from fused kernels; and the total row."""
    order, phases, cells, pct = block_cells(run)
    fused = fused_cells(run)  # compiled runs: the ms of each row that came from fused kernels
    rows, total, fused_total = [], 0.0, 0.0
    for key in order:
        row = cells[key]
        s = sum(row.values())
        total += s
        extra = [f"{fused.get(key, 0.0):.3f}"] if fused is not None else []
        fused_total += fused.get(key, 0.0) if fused is not None else 0.0
        rows.append([row_label(key), *[f"{row[p]:.3f}" if p in row else "" for p in phases],
                     f"{s:.3f}", f"{pct[key]:.1f}%", *extra])
    last = ["total", *["" for _ in phases], f"{total:.3f}", "100.0%",
            *([f"{fused_total:.3f}"] if fused is not None else [])]
    headers = ["block", *[f"{p} ms" for p in phases], "total ms", "share", *(["fused ms"] if fused is not None else [])]
    return headers, rows, last



def fused_cells(run: Run) -> dict[str, float] | None:
    """Per row key, the ms that came from fused compiled kernels (None for runs without the column)."""
    if not any(b.fused_ms is not None for b in run.blocks):
        return None
    out: dict[str, float] = defaultdict(float)
    for b in run.blocks:
        name = folded(b.name)
        out[name if b.phase != "step" else f"step:{name}"] += b.fused_ms or 0.0
    return out


def fused_kernel_lines(run: Run, top: int = 5) -> list[str]:
    """The largest fused kernels of a compiled run and how each was split (from tables.fused_kernels)."""
    rows = sorted(run.tables.get("fused_kernels", []), key=lambda r: -float(r.get("profiled_ms") or 0.0))
    out = []
    for r in rows[:top]:
        split = ", ".join(f"{b} {100 * float(x):.0f}%" for b, x in zip(r.get("blocks", []), r.get("shares", [])))
        out.append(f"{r.get('kernel')} ({r.get('phase')}): {float(r.get('profiled_ms') or 0.0):.3f} ms per step "
                   f"profiled, split by {r.get('basis')}: {split}")
    if len(rows) > top:
        out.append(f"... {len(rows) - top} more in run.json (tables.fused_kernels)")
    return out


def off_goal_lines(run: Run) -> list[str]:
    """One line per block whose time misses attribution's goal against its stopwatch (Block.uncertain)."""
    return [f"{b.name} ({b.phase}) {b.time_ms:.3f} ms: {b.uncertain}" for b in run.blocks if b.uncertain]
