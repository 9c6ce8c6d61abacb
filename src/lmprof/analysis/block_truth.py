"""Which block times miss attribution's goal against a per-block stopwatch, and by how much.

The goal (issue 13): every block within +-10% of a stopwatch around it in a clean pass (device
synchronised, no profiler), matmul blocks within +-5%. A block whose attributed time misses its goal
is marked uncertain in the run record, the summary and the report, with its error, so nobody reads a
small operator's figure as more exact than it is. Blocks no stopwatch covers (backward blocks, which
autograd runs outside any scope; step parts) are left unmarked: there is nothing to compare.
"""
from __future__ import annotations

from typing import Mapping

from lmprof import names
from lmprof.record.run import Block

# Steps of the stopwatch pass a run makes (its median per block is the truth).
STOPWATCH_STEPS = 3
GOAL_PCT = 10.0
MATMUL_GOAL_PCT = 5.0
# Blocks that are one matmul each (plus a bias): the goal is tighter for them.
MATMUL_BLOCKS = frozenset(names.WEIGHT_MATMUL_BLOCKS)


def goal_pct(name: str) -> float:
    """The largest error a block's time may have against its stopwatch, in percent."""
    base = name.split("[", 1)[0]  # per-layer rows of module-path models: "attn.qkv[3]"
    return MATMUL_GOAL_PCT if base in MATMUL_BLOCKS else GOAL_PCT


def error_pct(attributed_ms: float, stopwatch_ms: float) -> float:
    """100 x (attributed - stopwatch) / stopwatch."""
    return 100.0 * (attributed_ms - stopwatch_ms) / stopwatch_ms


def mark_uncertain(blocks: list[Block], stopwatch_ms: Mapping[tuple[str, str], float]) -> list[Block]:
    """``blocks`` with ``stopwatch_ms`` filled where a stopwatch covers them and ``uncertain`` set where
    the attributed ``time_ms`` misses its goal. ``stopwatch_ms``: (block, phase) -> ms per step, from
    the same run's clean stopwatch pass."""
    out = []
    for b in blocks:
        truth = stopwatch_ms.get((b.name, b.phase))
        if truth is None or truth <= 0:
            out.append(b)
            continue
        err, goal = error_pct(b.time_ms, truth), goal_pct(b.name)
        why = (f"{err:+.0f}% against a per-block stopwatch ({truth:.3f} ms; goal +-{goal:g}%)"
               if abs(err) > goal else None)
        out.append(b.model_copy(update={"stopwatch_ms": truth, "uncertain": why}))
    return out
