"""``record_function`` / ``user_annotation`` ranges (and ``nn.Module`` ranges) as a nested table: count, inclusive and self
time on the host, device time of the kernels launched inside, and the "dead window" from each
range's start to its first operator.

A range's row is keyed by its path of enclosing annotations on the same thread (``outer > inner``),
so the same name under two parents is two rows. ``ProfilerStep#N`` ranges are one row,
``ProfilerStep#*``, so that what runs inside every step shares one path; each step's own dead
window is kept too (:class:`StepDead`: a mean and a maximum hide which step stalled).
"""
from __future__ import annotations


import numpy as np

from lmprof.trace import groups, kinds
from lmprof.trace.launches import launch_links
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import enclosing, parents, self_time
from lmprof.trace.records import Record
from lmprof.trace.steps import step_of

SEP = " > "
MODULE_PREFIX = "nn.Module: "
STEP_NAME = "ProfilerStep#*"


class AnnotationRow(Record, frozen=True):
    """All calls of one annotation path; times in microseconds, summed over the calls."""

    path: str  # enclosing annotation names and this one, joined by " > "
    name: str
    depth: int  # 0 for an annotation inside no other
    count: int
    total_us: float  # inclusive: the ranges' own durations
    self_us: float  # minus the host events directly inside (operators, runtime calls, annotations)
    mean_us: float
    device_us: float | None  # kernels / copies launched inside (summed); None for a trace without device work
    dead_mean_us: float | None  # start to its first operator, mean over calls that have one
    dead_max_us: float | None
    first_op: str | None  # the operator that most often comes first


class StepDead(Record, frozen=True):
    """One ``ProfilerStep#N``'s dead window, in microseconds from the step's start."""

    step: int  # N
    dead_us: float | None  # to the first operator inside it (None: none)
    first_op: str | None
    to_first_kernel_us: float | None  # to the first device event launched from it (None: none, or no device work)


class Annotations(Record, frozen=True):
    """Every user annotation of a trace, parents before their children."""

    count: int  # annotation ranges in the trace
    rows: list[AnnotationRow]
    steps: list[StepDead] = []  # each ProfilerStep's dead window, in step order (annotations only)


def annotation_breakdown(table: TraceTable) -> Annotations | None:
    """The annotation table of one trace, or None when it has no ``user_annotation`` range."""
    return _ranges(table, kinds.annotation_mask(table), by_tree=False, steps=True)


def module_breakdown(table: TraceTable) -> Annotations | None:
    """The ``nn.Module`` tree of a trace recorded with ``with_modules`` (and ``with_stack``), or None.

    Like the annotation table, but a module's self time is its time outside its child modules
    (not outside every Python frame and operator inside it).
    """
    mods = kinds.cat_mask(table, lambda c: c == "python_function")
    mods &= kinds.name_mask(table, lambda n: n.startswith(MODULE_PREFIX))
    return _ranges(table, mods, by_tree=True)


def _ranges(table: TraceTable, amask: np.ndarray, by_tree: bool, steps: bool = False) -> Annotations | None:
    """Rows of the ranges in ``amask``, nested among themselves; ``by_tree``: self time is outside
    child ranges of the mask, else outside every host event directly inside; ``steps``: with each
    ProfilerStep's own dead window."""
    ev = table.event_cols
    rows = np.flatnonzero(amask)
    if rows.size == 0:
        return None
    ts = ev["ts"]
    dur = table.durations()
    codes = ev["name"]
    cats = ev.labels("name")
    labels = np.array([_label(str(n)) for n in cats] + [""], dtype=object)
    names = labels[codes[rows]]  # code -1 (no name) takes the trailing ""

    pos, apos = _tree(table, amask, rows)
    path = names.copy()
    depth = np.zeros(rows.size, dtype=np.int64)
    done = apos < 0
    while not done.all():
        ready = ~done & done[np.maximum(apos, 0)]
        path[ready] = path[apos[ready]] + SEP + names[ready]
        depth[ready] = depth[apos[ready]] + 1
        done |= ready

    if by_tree:
        kid = apos >= 0
        own = dur[rows] - np.bincount(apos[kid], weights=dur[rows][kid], minlength=rows.size)
    else:
        own = self_time(table)[rows]
    device_us = _device_inside(table, amask, pos, rows.size)
    first_ts, first_code = _first_op(table, amask, pos, rows.size, apos, depth)
    dead = first_ts - ts[rows]
    dead = np.where(np.isfinite(first_ts), dead, np.nan)
    device = device_us if device_us is not None else np.zeros(rows.size)
    own = np.maximum(own, 0.0)
    # one row per distinct path (a handful, not per event), in path order
    uniq, g = groups.group_by(path)
    n = len(uniq)
    first_row = groups.group_first(g, n, np.arange(rows.size))
    count = groups.group_sizes(g, n)
    total = groups.group_fsum(g, n, dur[rows])
    own_sum = groups.group_fsum(g, n, own)
    device_sum = groups.group_fsum(g, n, device)
    dead_mean = groups.group_nanmean(g, n, dead)
    dead_max = groups.group_nanmax(g, n, dead)
    common = _most_common(g[first_code >= 0], first_code[first_code >= 0], n)
    out = []
    for i, p in enumerate(uniq.tolist()):
        code = int(common[i])
        out.append(AnnotationRow(
            path=str(p), name=str(names[first_row[i]]), depth=int(depth[first_row[i]]), count=int(count[i]),
            total_us=float(total[i]), self_us=float(own_sum[i]), mean_us=float(total[i]) / int(count[i]),
            device_us=float(device_sum[i]) if device_us is not None else None,
            dead_mean_us=None if np.isnan(dead_mean[i]) else float(dead_mean[i]),
            dead_max_us=None if np.isnan(dead_max[i]) else float(dead_max[i]),
            first_op=str(cats[code]) if code >= 0 else None,
        ))  # fmt: skip
    per_step = _step_dead(table, rows, codes[rows], first_ts, first_code) if steps else []
    return Annotations(count=int(rows.size), rows=_tree_order(out), steps=per_step)


def _step_dead(table: TraceTable, rows: np.ndarray, codes: np.ndarray, first_ts: np.ndarray,
               first_code: np.ndarray) -> list[StepDead]:
    """Each ProfilerStep range among ``rows`` with its start to its first operator (``first_ts``,
    the same figure the ``ProfilerStep#*`` row's mean and max summarise) and to the first device
    event launched from it (its runtime call starts inside the step, as steps.parquet counts)."""
    cats = table.event_cols.labels("name")
    lut = np.full(len(cats) + 1, -1, dtype=np.int64)  # name code -> step number (-1: not a step; code -1 too)
    for c in groups.distinct(codes[codes >= 0]).tolist():
        n = kinds.step_number(str(cats[c]))
        lut[c] = -1 if n is None else n
    number = lut[codes]
    at = np.flatnonzero(number >= 0)
    if at.size == 0:
        return []
    ts = table.event_cols["ts"]
    kernel = _first_kernel_by_step(table)
    out = []
    for i in at[np.argsort(ts[rows[at]], kind="stable")].tolist():
        n, start = int(number[i]), float(ts[rows[i]])
        op = first_ts[i]
        k = kernel.get(n)
        out.append(StepDead(step=n, dead_us=float(op - start) if np.isfinite(op) else None,
                            first_op=str(cats[first_code[i]]) if first_code[i] >= 0 else None,
                            to_first_kernel_us=None if k is None else k - start))
    return out


def _first_kernel_by_step(table: TraceTable) -> dict[int, float]:
    """Per ProfilerStep number, the start of the earliest device event whose runtime call starts in it."""
    if not kinds.device_mask(table).any():
        return {}
    links = launch_links(table)
    rt, dev = links["runtime"], links["event"]
    linked = rt >= 0
    if not linked.any():
        return {}
    ts = table.event_cols["ts"]
    step = step_of(table, ts[rt[linked]])
    start = ts[dev[linked]]
    keep = step >= 0
    step, start = step[keep], start[keep]
    order = np.lexsort((start, step))  # by step, earliest first
    step, start = step[order], start[order]
    first = np.concatenate([[True], step[1:] != step[:-1]]) if step.size else np.zeros(0, dtype=bool)
    return dict(zip(step[first].tolist(), start[first].tolist()))


def _most_common(group: np.ndarray, code: np.ndarray, n: int) -> np.ndarray:
    """Per group, the code that occurs most often (the smallest of tied ones), -1 for a group without any."""
    out = np.full(n, -1, dtype=np.int64)
    if code.size == 0:
        return out
    pairs, counts = np.unique(np.stack([group, code]), axis=1, return_counts=True)
    order = np.lexsort((pairs[1], -counts, pairs[0]))  # by group, then most frequent, then smallest code
    g = pairs[0][order]
    first = np.concatenate([[True], g[1:] != g[:-1]])
    out[g[first]] = pairs[1][order][first]
    return out


def _tree(table: TraceTable, amask: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The annotation tree: each event's position among ``rows`` (-1 elsewhere), and each range's
    parent annotation's position (-1 at the top)."""
    pos = np.full(len(table.event_cols), -1, dtype=np.int64)
    pos[rows] = np.arange(rows.size)
    up = enclosing(table, rows, amask)
    return pos, np.where(up >= 0, pos[np.maximum(up, 0)], -1)


def _depths(apos: np.ndarray) -> np.ndarray:
    depth = np.zeros(apos.size, dtype=np.int64)
    done = apos < 0
    while not done.all():
        ready = ~done & done[np.maximum(apos, 0)]
        depth[ready] = depth[apos[ready]] + 1
        done |= ready
    return depth


def dead_windows(table: TraceTable) -> tuple[np.ndarray, np.ndarray]:
    """Every annotation range (row into events) and the start of the first operator inside it
    (inf when none): the per-range dead windows that ``dead_mean_us`` / ``dead_max_us`` summarise."""
    amask = kinds.annotation_mask(table)
    rows = np.flatnonzero(amask)
    if rows.size == 0:
        return rows, np.zeros(0)
    pos, apos = _tree(table, amask, rows)
    first, _ = _first_op(table, amask, pos, rows.size, apos, _depths(apos))
    return rows, first


def _label(name: str) -> str:
    """The row name: ``ProfilerStep#*`` for every step, a module without the ``nn.Module: `` prefix."""
    if kinds.step_number(name) is not None:
        return STEP_NAME
    return name[len(MODULE_PREFIX):] if name.startswith(MODULE_PREFIX) else name


def _tree_order(rows: list[AnnotationRow]) -> list[AnnotationRow]:
    """Parents before children; siblings by inclusive time, largest first."""
    by_path = {r.path: r for r in rows}

    def key(r: AnnotationRow) -> list[tuple[float, str]]:
        parts = r.path.split(SEP)
        prefixes = [SEP.join(parts[: i + 1]) for i in range(len(parts))]
        return [(-(by_path[p].total_us if p in by_path else 0.0), p) for p in prefixes]

    return sorted(rows, key=key)


def _device_inside(table: TraceTable, amask: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray | None:
    """Summed duration of the device events launched inside each annotation (at any depth)."""
    if not kinds.device_mask(table).any():
        return None
    links = launch_links(table)
    rt = links["runtime"]
    dur = np.maximum(table.event_cols["dur"][links["event"]], 0.0)
    par = parents(table)
    out = np.zeros(n)
    at = np.flatnonzero(rt >= 0)
    hop = par[rt[at]]
    while at.size:  # one vectorised step per nesting level
        live = hop >= 0
        at, hop = at[live], hop[live]
        hit = amask[hop]
        np.add.at(out, pos[hop[hit]], dur[at[hit]])
        hop = par[hop]
    return out


def _first_op(
    table: TraceTable, amask: np.ndarray, pos: np.ndarray, n: int, apos: np.ndarray, depth: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Start and name code of the earliest operator inside each annotation (inf / -1 when none)."""
    ev = table.event_cols
    ops = np.flatnonzero(kinds.op_mask(table))
    owner = enclosing(table, ops, amask)
    ops, owner = ops[owner >= 0], owner[owner >= 0]
    first = np.full(n, np.inf)
    code = np.full(n, -1, dtype=np.int64)
    ts = ev["ts"]
    op_codes = ev["name"].astype(np.int64)
    # the earliest op directly owned: sort by start, keep the first per owner
    order = np.argsort(ts[ops], kind="stable")
    o_pos = pos[owner[order]]
    keep = np.unique(o_pos, return_index=True)[1]
    first[o_pos[keep]] = ts[ops[order][keep]]
    code[o_pos[keep]] = op_codes[ops[order][keep]]
    # then up the annotation tree, deepest level first, so a parent sees its children's first op
    for d in range(int(depth.max(initial=0)), 0, -1):
        kids = np.flatnonzero((depth == d) & np.isfinite(first))
        parent = apos[kids]
        better = first[kids] < first[parent]
        # several children of one parent: take the earliest
        kids, parent = kids[better], parent[better]
        o = np.argsort(first[kids], kind="stable")
        kids, parent = kids[o], parent[o]
        u = np.unique(parent, return_index=True)[1]
        first[parent[u]] = first[kids[u]]
        code[parent[u]] = code[kids[u]]
    return first, code
