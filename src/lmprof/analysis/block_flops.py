"""FLOPs and achieved FLOP/s of the blocks a trace's named ranges give (``analyze --model``).

The trace gives each block path its ranges (forward and backward calls) and device time
(:mod:`lmprof.trace.blocks`); the model's shape, batch and sequence length give each block's FLOPs
per call from lmprof's formulas (:func:`lmprof.estimate.flops.block_costs`, the counts of
``lmprof roofline``): FLOPs = forward calls x forward cost + backward calls x backward cost, and
achieved FLOP/s = FLOPs / device time. A block's cost per call is its cost over the model divided
by how many times one pass runs it (``n_layer`` for per-layer blocks, once for the rest); blocks the
formulas know: lmprof's block names (``attn.qkv``, ``mlp.fc``, ...), ``layer`` (one transformer
layer: the per-layer blocks together, attention counted unfused), ``forward`` / ``backward`` (a whole
pass). ``attn.sdpa`` is counted as the fused block (scores, softmax and AV). Others get no FLOPs
(``n/a``), as does a row whose ranges ran in a phase the formulas have no count for.

FLOPs are **estimated** (formulas), device times **measured**, FLOP/s **derived**. Device time is the
summed duration of the block's kernels, so kernels that ran at the same time on two streams both
count: FLOP/s is then a lower bound.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lmprof.estimate.flops import BlockCost, block_costs
from lmprof.estimate.shape import ModelShape
from lmprof.trace.blocks import BlockBreakdown

LAYER, FORWARD, BACKWARD = "layer", "forward", "backward"
_MODEL_WIDE = ("embedding", "ln_f", "lm_head", "loss")  # run once per pass, not per layer


@dataclass(frozen=True)
class BlockFlopsRow:
    """One block path's FLOPs (counts, rounded to whole FLOPs) and rate."""

    path: str
    flops: int | None  # estimated; None when the formulas do not know the block
    achieved_flops_per_s: float | None  # derived: flops / device time
    forward_flops_per_call: int | None
    backward_flops_per_call: int | None


@dataclass(frozen=True)
class BlockFlops:
    """FLOPs per block path of one trace, in the rows' order."""

    model: str
    batch: int
    seq_len: int
    rows: list[BlockFlopsRow]
    source: str = "estimated FLOPs (lmprof's formulas), measured device time, derived FLOP/s"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_call_costs(shape: ModelShape, batch: int, seq_len: int) -> dict[str, dict[str, float]]:
    """Block name -> {"forward": FLOPs per call, "backward": ...} for the names listed in the
    module docstring."""
    out: dict[str, dict[str, float]] = {}
    for phase in (FORWARD, BACKWARD):
        costs: list[BlockCost] = block_costs(shape, batch=batch, seq_len=seq_len, phase=phase, attention="math")
        per = {c.name: c.flops / max(c.count, 1) for c in costs}
        fused = block_costs(shape, batch=batch, seq_len=seq_len, phase=phase, attention="sdpa")
        per.update({c.name: c.flops / max(c.count, 1) for c in fused if c.name == "attn.sdpa"})
        layer = sum(c.flops for c in costs if c.name not in _MODEL_WIDE) / shape.n_layer
        per[LAYER] = layer
        per[phase] = sum(c.flops for c in costs)
        for name, v in per.items():
            out.setdefault(name, {})[phase] = v
    return out


def _whole(x: float | None) -> int | None:
    return None if x is None else round(x)


def block_flops(blocks: BlockBreakdown, model: str, shape: ModelShape, batch: int, seq_len: int) -> BlockFlops:
    """FLOPs and FLOP/s of every block row (see the module docstring)."""
    costs = per_call_costs(shape, batch, seq_len)
    rows = []
    for r in blocks.rows:
        c = costs.get(r.block, {})
        fwd, bwd = c.get(FORWARD), c.get(BACKWARD)
        per_call = (_whole(fwd), _whole(bwd))
        if not c or (r.forward_calls and fwd is None) or (r.backward_calls and bwd is None):
            rows.append(BlockFlopsRow(r.path, None, None, *per_call))
            continue
        flops = r.forward_calls * (fwd or 0.0) + r.backward_calls * (bwd or 0.0)
        rate = flops / (r.device_us * 1e-6) if r.device_us > 0 else None
        rows.append(BlockFlopsRow(r.path, round(flops), rate, *per_call))
    return BlockFlops(model=model, batch=batch, seq_len=seq_len, rows=rows)
