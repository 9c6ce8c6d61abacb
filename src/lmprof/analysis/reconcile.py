"""Block times that add up to the clean step, with the profiler's per-event cost taken out first.

Attribution (trace/attribution.py) gives each block's time *under the profiler*. The profiler
costs a roughly fixed time per recorded event (measure/profiler_cost.py), so a block made of many
small ops is inflated far more than a matmul block. Reconciling therefore goes in three steps:

1. **Subtract** (CPU clock only): each (block, phase) loses, per step, its recorded operators x the
   per-op cost, its own ranges x the part of a range's cost that lands inside it, and the ranges
   nested directly in it x the part that lands outside them (in their parent).
2. **Median over the profiled steps**, per block, so one disturbed step does not move a block.
3. **Scale** the medians so they add up to the clean (profiler-free) median step: what remains of
   the profiler's cost after step 1, and run-to-run noise, is spread in proportion.

Compiled runs: a block's ``fused_ms`` is its ``time_ms`` times the part of its profiled time (all
steps) that came from its shares of fused kernels.

On a device clock (GPU traces) kernel durations are not inflated by host-side recording, so step 1
is skipped; the run record says which correction was used.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lmprof import names
from lmprof.measure.profiler_cost import EventCost
from lmprof.record.run import Block
from lmprof.trace.attribution import Attribution, EventCounts, Key

# Above this the blocks' sum after correction and the clean step disagree enough to say so.
MISMATCH_NOTE_PCT = 10.0
# An ``other`` row at or above this share of the profiled step gets a note naming its largest operators.
OTHER_NOTE_PCT = 10.0
# The correction never takes a block below this share of its profiled time: a block that ran did
# take time, and past this point the profiler's cost dwarfs the block (the run names such blocks).
FLOOR_SHARE = 0.1


@dataclass
class Reconciled:
    """Block rows scaled to the clean step, and how they were obtained."""

    blocks: list[Block]
    correction: str
    removed_us_per_step: float  # profiler cost taken out before scaling
    scale: float  # clean step / sum of corrected block medians
    notes: list[str] = field(default_factory=list)
    own_us_per_step: float = 0.0  # lmprof's own ranges in a profiled step (median), left out of the rows


def event_overhead_us(counts: EventCounts, cost: EventCost) -> float:
    """Profiler time per step that lands in one (block, phase), from its event counts."""
    scope_in, scope_out = cost.scope_inside_us, cost.scope_outside_us
    in_share = scope_in / cost.scope_us if cost.scope_us > 0 else 0.5
    return (counts.ops * cost.op_us
            + counts.scopes * scope_in + counts.child_scopes * scope_out
            + counts.op_ranges * cost.op_us * in_share + counts.child_op_ranges * cost.op_us * (1 - in_share))


def _fused_fraction(att: Attribution, key: Key) -> float:
    """The part of a block's profiled time, over all steps, that came from fused compiled kernels."""
    raw = sum(s.get(key, 0.0) for s in att.per_step)
    fused = sum(s.get(key, 0.0) for s in att.fused_per_step)
    return min(1.0, max(0.0, fused / raw)) if raw > 0 else 0.0


def _other_note(block: Block, att: Attribution) -> str | None:
    """What an ``other`` row of :data:`OTHER_NOTE_PCT` or more holds: its largest operators (CPU clock)."""
    found = att.other_ops.get((block.name, block.phase))
    if block.name != names.OTHER or block.pct < OTHER_NOTE_PCT or not found or block.profiled_ms <= 0:
        return None
    total_us, ops = found
    where = ("the loop's own work between the model's phases (outside its forward and backward, the optimizer "
             "and zero_grad: an EMA update, metrics, logging)" if block.phase == names.STEP
             else f"time in the {block.phase} that no block's scope holds")
    listed = ", ".join(f"{name} ({us / 1e3:.3g} ms)" for name, us in ops)
    share = min(100.0, 100.0 * total_us / 1e3 / block.profiled_ms)
    return (f"{block.name} ({block.phase}) is {block.pct:.0f}% of the profiled step: {where}. Operators called "
            f"directly in it take {share:.0f}% of its profiled time (the rest is Python between them); the largest, "
            f"profiled time a step: {listed}")


def reconcile(att: Attribution, clean_ms: float, cost: EventCost | None) -> Reconciled:
    """Block rows for the run record: corrected, per-step medians, scaled to ``clean_ms``."""
    subtract = att.clock == "cpu" and cost is not None
    steps = att.per_step or [{(p.name, p.phase): p.us for p in att.parts}]
    keys: list[Key] = sorted({k for s in steps for k in s} | {(p.name, p.phase) for p in att.parts})
    # lmprof's own work in the step (names.LMPROF) is neither a block's nor the user's loop: it is not
    # in the clean step, so it is no row and is not scaled to it
    own = [k for k in keys if k[0] == names.LMPROF]
    own_us = float(np.median([sum(s.get(k, 0.0) for k in own) for s in steps])) if own else 0.0
    keys = [k for k in keys if k[0] != names.LMPROF]
    overhead = {k: event_overhead_us(att.events.get(k, EventCounts()), cost) if subtract and cost else 0.0
                for k in keys}
    corrected = {k: np.array([max(s.get(k, 0.0) - overhead[k], FLOOR_SHARE * s.get(k, 0.0)) if subtract
                              else s.get(k, 0.0) for s in steps])
                 for k in keys}
    floored = [k for k in keys if subtract and any(s.get(k, 0.0) > 0 and s.get(k, 0.0) - overhead[k] < FLOOR_SHARE
                                                   * s.get(k, 0.0) for s in steps)]
    median = {k: float(np.median(v)) for k, v in corrected.items()}
    # A block that ran in fewer than half of the profiled steps (an evaluation's generate() in one of them) has a
    # median of nothing: no row of 0 ms, a note that says where it ran and for how long
    rare = [k for k in keys if median[k] == 0.0 and any(s.get(k, 0.0) > 0 for s in steps) and len(steps) > 1]
    keys = [k for k in keys if k not in rare]
    total = sum(median.values())
    clean_us = clean_ms * 1e3
    scale = clean_us / total if total > 0 else 1.0
    parts = {(p.name, p.phase): p for p in att.parts}
    rows = []
    for k in sorted(keys, key=lambda k: (k[1], -median[k])):
        part = parts.get(k)
        v = corrected[k]
        spread = float(np.percentile(v, 90) - np.percentile(v, 10)) * scale / 1e3 if len(v) > 1 else None
        time_ms = median[k] * scale / 1e3
        rows.append(Block(
            name=k[0], phase=k[1], time_ms=time_ms,
            profiled_ms=(part.us if part else 0.0) / 1e3, pct=100.0 * median[k] / total if total else 0.0,
            calls=round(part.calls) if part else 0, spread_ms=spread,
            fused_ms=time_ms * _fused_fraction(att, k) if att.compiled else None,
            ops=round(att.issued[k], 3) if k in att.issued else (0.0 if att.issued else None),
        ))
    removed = sum(min(overhead[k], float(np.median([s.get(k, 0.0) for s in steps]))) for k in keys)
    notes = [n for n in (_other_note(b, att) for b in rows) if n]
    if rare:
        notes.append(f"ran in fewer than half of the {len(steps)} profiled steps, so in no row (each row is the "
                     "median step's): " + "; ".join(
                         f"{n} ({p}): " + ", ".join(f"{s.get((n, p), 0.0) / 1e3:.3g} ms (profiled) in step {i + 1}"
                                                    for i, s in enumerate(steps) if s.get((n, p), 0.0) > 0)
                         for n, p in rare[:6]))
    if floored:
        notes.append("the profiler's own cost exceeded most of these blocks' profiled time, so their figures are "
                     f"uncertain (kept at {FLOOR_SHARE:.0%} of the profiled time): "
                     + ", ".join(f"{n} ({p})" for n, p in floored[:8]) + (" ..." if len(floored) > 8 else ""))
    if subtract and cost is not None:
        correction = (f"profiler cost per event subtracted before scaling (CPU clock): {cost.op_us:.2f} us per "
                      f"operator, {cost.scope_us:.2f} us per scope, measured on this machine"
                      + (f"; lmprof's own hooks in the step ({own_us:.0f} us a profiled step, timed by their own "
                         "ranges) left out" if own_us > 0 else ""))
        mismatch = 100.0 * (1.0 / scale - 1.0) if scale else 0.0
        if abs(mismatch) > MISMATCH_NOTE_PCT:
            notes.append(
                f"after removing the profiler's per-event cost ({removed / 1e3:.3g} ms per step) the blocks add up to "
                f"{total / 1e3:.3g} ms against the clean {clean_ms:.3g} ms ({mismatch:+.0f}%): the difference is spread "
                "over the blocks in proportion, so small blocks carry that much uncertainty")
    elif att.clock == "device":
        correction = "none: device clock (kernel durations are not inflated by host-side recording)"
    else:
        correction = "none: profiler cost per event not measured; blocks scaled by one factor"
    return Reconciled(rows, correction, removed, scale, notes, own_us)
