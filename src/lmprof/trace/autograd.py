"""Backward nodes and the forward operators that created them (autograd sequence numbers).

The autograd engine runs each backward node as a ``cpu_op`` named
``autograd::engine::evaluate_function: <Node>`` on its own thread; the node, and the forward
operator whose autograd node it is, carry the same ``Sequence number`` (column ``seq``). Together
with :func:`lmprof.trace.launches.kernel_launches` this maps a backward kernel to its forward op,
and from there (via :func:`lmprof.trace.nesting.enclosing`) to the forward ``record_function`` scope.
"""
from __future__ import annotations

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import _nearest_matching_ancestor

BACKWARD_PREFIX = "autograd::engine::evaluate_function:"


def backward_node_mask(table: TraceTable) -> np.ndarray:
    """Rows that are autograd backward nodes (``autograd::engine::evaluate_function: ...``)."""
    return kinds.op_mask(table) & kinds.name_mask(table, lambda n: n.startswith(BACKWARD_PREFIX))


def forward_op(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """For each row, the forward ``cpu_op`` with the same sequence number, or -1.

    Forward ops record the sequence number the next autograd node will take, so every op from the
    previous node's creation up to this node's creation carries it (e.g. ``aten::add_`` on the
    running stats before ``aten::cudnn_batch_norm``); the op that creates the node starts last. So
    the forward op is the latest-starting ``cpu_op`` with that ``seq`` that is neither a backward
    node nor inside one (the backward side repeats the number). Rows without a ``seq`` (e.g.
    ``AccumulateGrad``) get -1.
    """
    ev = table.event_cols
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(len(rows), -1, dtype=np.int64)
    seq = ev["seq"]
    in_backward = _nearest_matching_ancestor(table, backward_node_mask(table)) >= 0
    cand = np.flatnonzero(kinds.op_mask(table) & (seq >= 0) & ~in_backward)
    if cand.size == 0 or rows.size == 0:
        return out
    # rows are sorted by ts: keep the last row of each sequence number
    rev = cand[::-1]
    keys, last = np.unique(seq[rev], return_index=True)
    cand = rev[last]
    ok = rows >= 0
    want = np.where(ok, seq[np.maximum(rows, 0)], -1)
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    hit = ok & (want >= 0) & (keys[pos] == want)
    out[hit] = cand[pos[hit]]
    return out
