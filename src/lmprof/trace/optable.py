"""The operator table (torch.profiler's ``key_averages()`` rule) from a loaded trace.

torch builds the table from its own event objects, which costs seconds per hundred thousand events
and, inside a user's profiled step, is time the user waits for. The trace lmprof writes holds the
same events, and lmprof's reader loads a million of them in about a second, so the table is made
here, after the user's call returned. The rule is torch's: every host operator and
``record_function`` range, grouped by name; self time is the duration minus the direct children's
on the same thread; device time is the device work an operator launched itself (its kernels'
runtime calls have it as their innermost operator).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmprof.trace import kinds, nesting
from lmprof.trace.launches import launching_calls
from lmprof.trace.load import TraceTable
from lmprof.trace.steps import profiler_steps


@dataclass(frozen=True)
class OpRow:
    """One operator name's figures per step: the median over the counted steps (us)."""

    name: str
    count: float
    self_us: float
    total_us: float
    device_us: float | None


#: The range a Python dispatch mode (FlopCounterMode) puts around each op it sees: not an operator.
DISPATCH_MODE = "PythonDispatchMode"


def op_rows(table: TraceTable, *, steps: int | None = None, skip_prefixes: tuple[str, ...] = ()) -> list[OpRow]:
    """Each operator's figures **per step**, the median over ProfilerStep ranges 1..``steps`` (every
    step when None), sorted by self time. The median, not torch's mean: one disturbed step must not
    reorder the table (its mean would put whatever ran during the disturbance on top); with one step
    the two agree. Events outside every counted range (the profiler's warm-up step, gaps between a
    user's steps, a step still open at the end) are left out. Names starting with ``skip_prefixes``
    are left out of the rows (their time still counts as their children's parent, as in torch's table),
    and so is :data:`DISPATCH_MODE`: not an operator but the Python cost of a dispatch mode that was on
    (FlopCounterMode in lmprof's figures step), which would otherwise top a first call's table.
    """
    ev = table.event_cols  # numpy columns: the table needs no pandas
    all_names = table.names()
    host = np.flatnonzero(kinds.op_mask(table) | kinds.annotation_mask(table))
    st = profiler_steps(table)
    if steps is not None:
        st = st.take(st["step"] <= steps)
    if host.size == 0 or st.empty:
        return []
    start = st["ts"].astype(float)
    order = np.argsort(start)
    start, end = start[order], (st["ts"] + st["dur"]).astype(float)[order]
    t = np.asarray(ev["ts"], dtype=float)[host]
    pos = np.searchsorted(start, t, side="right") - 1
    inside = (pos >= 0) & (t < end[np.maximum(pos, 0)])
    rows, step_of = host[inside], pos[inside]
    names = all_names[rows]
    keep = np.array([not (n.startswith("ProfilerStep") or n == DISPATCH_MODE or n.startswith(skip_prefixes))
                     for n in names], dtype=bool)
    rows, step_of = rows[keep], step_of[keep]
    if rows.size == 0:
        return []
    rows, self_us, step_of = _fold_duplicates(table, rows, nesting.self_time(table), step_of)
    names = all_names[rows].astype(str)
    total_us = np.maximum(np.asarray(ev["dur"], dtype=float)[rows], 0.0)
    device = _launched_device_us(table)
    uniq, inv = np.unique(names, return_inverse=True)
    n_steps = len(start)
    cell = inv * n_steps + step_of  # one cell per (operator, step); absent operators count 0 in a step

    def median(weights: np.ndarray | None) -> np.ndarray:
        sums = np.bincount(cell, weights=weights, minlength=len(uniq) * n_steps).reshape(len(uniq), n_steps)
        return np.median(sums, axis=1)

    count, self_med, total_med = median(None), median(self_us), median(total_us)
    dev_med = median(device[rows]) if device is not None else None
    out = [OpRow(str(n), float(count[i]), float(self_med[i]), float(total_med[i]),
                 float(dev_med[i]) if dev_med is not None else None)
           for i, n in enumerate(uniq)]
    out = [r for r in out if r.count > 0 or r.self_us > 0]
    out.sort(key=lambda r: r.self_us, reverse=True)
    return out


def _fold_duplicates(table: TraceTable, rows: np.ndarray, self_all: np.ndarray,
                     step_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's table folds an event into its parent when the parent has the same name and no other
    child (``aten::sum`` calling an ``aten::sum`` overload); the pair is then one call whose self time
    is both self times together. The same here, so counts and totals equal torch's.

    A Python dispatch mode (``FlopCounterMode``, on in lmprof's figures step) puts a
    ``PythonDispatchMode`` range between the two halves of one call (``aten::addmm`` ->
    ``PythonDispatchMode`` -> ``aten::addmm``): torch's table counts that call twice; here the inner
    half is folded into the outer one the same way (the mode's own range is no row: see op_rows)."""
    par = nesting.parents(table)
    ev = table.event_cols
    names = ev["name"]
    labels = list(ev.labels("name"))
    n_children = np.bincount(par[par >= 0], minlength=len(par))
    p = par[rows]
    mode_code = labels.index(DISPATCH_MODE) if DISPATCH_MODE in labels else -2
    via_mode = (p >= 0) & (names[np.maximum(p, 0)] == mode_code) & (n_children[np.maximum(p, 0)] == 1)
    p = np.where(via_mode, par[np.maximum(p, 0)], p)  # look through the mode's range to the outer half
    dup = (p >= 0) & (names[rows] == names[np.maximum(p, 0)]) & (n_children[np.maximum(p, 0)] == 1)
    self_us = self_all.copy()
    np.add.at(self_us, p[dup], self_all[rows[dup]])
    kept = rows[~dup]
    return kept, self_us[kept], step_of[~dup]


def _launched_device_us(table: TraceTable) -> np.ndarray | None:
    """Per host row, the device time of the kernels it launched itself (None on a host-only trace)."""
    dev_rows = np.flatnonzero(kinds.device_mask(table))
    if dev_rows.size == 0:
        return None
    ev = table.event_cols
    launch = launching_calls(table, dev_rows)
    ok = launch >= 0
    owner = nesting.enclosing(table, launch[ok], kinds.op_mask(table) | kinds.annotation_mask(table))
    dur = np.maximum(np.asarray(ev["dur"], dtype=float)[dev_rows[ok]], 0.0)
    has = owner >= 0
    return np.bincount(owner[has], weights=dur[has], minlength=len(ev)).astype(float)
