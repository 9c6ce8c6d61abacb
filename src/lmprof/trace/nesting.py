"""How host events nest on their thread: parent of each event, enclosing events, self time.

Host events (operators, annotations, runtime calls, python functions) on one (pid, tid) form a
forest by time containment: B is inside A when A starts no later and ends no earlier than B. The
parent of an event is the innermost event that contains it. Events that only partly overlap are not
nested (the later one is treated as a sibling). The result is cached on the table because several
analyses need it and it is the one step that walks events in Python.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np

from lmprof.trace.groups import pair_codes
from lmprof.trace.kinds import host_mask
from lmprof.trace.load import TraceTable

# ts + dur can land a rounding error after the parent's end; this much slack keeps such a child a
# child. (Traces stamped in epoch microseconds resolve only 0.25 us in float64: nesting finer than
# that cannot be recovered from them, see docs/trace-analysis.md.)
_END_SLACK_US = 1e-3


def _load_native() -> ModuleType | None:
    try:  # built at install (setup.py) like the C trace reader; without a compiler numpy does it
        return importlib.import_module("lmprof.trace._nest")
    except ImportError:  # pragma: no cover - depends on the build
        return None


_nest = _load_native()
# the C reader's switch: LMPROF_TRACE_NATIVE=0 turns every compiled fast path off
NATIVE = _nest is not None and os.environ.get("LMPROF_TRACE_NATIVE", "1").strip() != "0"
_NATIVE_STEPS_PER_EVENT = 32  # the walk's budget: nested traces take one or two steps per event


def parents(table: TraceTable) -> np.ndarray:
    """Row of the innermost host event that contains each row on the same thread; -1 for roots.

    Device events and GPU-track markers get -1. Indexed like ``table.event_cols``.
    """
    cached = table.cache.get("parents")
    if cached is None:
        cached = table.cache["parents"] = _parents(table)
    return cached


def _parents(table: TraceTable) -> np.ndarray:
    ev = table.event_cols
    out = np.full(len(ev), -1, dtype=np.int64)
    rows = np.flatnonzero(host_mask(table))
    if rows.size == 0:
        return out
    # per thread, by start; the longer first on equal starts so the container precedes the contained.
    # Temporaries are dropped as soon as possible: this is the analyses' largest working set.
    thread = pair_codes(ev["pid"][rows], ev["tid"][rows])
    ts = ev["ts"][rows]
    neg_dur = -np.maximum(ev["dur"][rows], 0.0)
    order = _thread_order(thread, ts, neg_dur)
    rows, ts, thread = rows[order], ts[order], thread[order]
    end = ts - neg_dur[order]
    del neg_dur, order
    new_thread = np.empty(len(rows), dtype=bool)
    new_thread[0] = False
    np.not_equal(thread[1:], thread[:-1], out=new_thread[1:])
    del thread
    out[rows] = sorted_parents(ts, end, np.cumsum(new_thread, dtype=np.int32), rows)
    return out


def thread_order(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, neg_dur: np.ndarray) -> np.ndarray:
    """The permutation ``np.lexsort((neg_dur, ts, tid, pid))``: by thread, then start, then longest
    first, then index; at a fraction of its cost.

    lexsort sorts the whole array once per key, the first pass by the least significant key, which
    is in no order; here the one full sort is by ``ts``, which traces mostly hold in order already
    (a stable sort of sorted data is one pass). Only the events that share a start are then sorted
    by duration, and the thread, numbered (pid, tid) in sorted order, is a small integer key.
    """
    return _thread_order(pair_codes(pid, tid), ts, neg_dur)


def _thread_order(thread: np.ndarray, ts: np.ndarray, neg_dur: np.ndarray) -> np.ndarray:
    order = np.argsort(ts, kind="stable")
    t = ts[order]
    same = np.flatnonzero(t[1:] == t[:-1])  # i and i + 1 start together
    if same.size:
        tied = np.zeros(len(t), dtype=bool)
        tied[same] = tied[same + 1] = True
        sub = np.flatnonzero(tied)
        group = np.cumsum(np.concatenate([[True], t[1:] != t[:-1]]))[sub]
        order[sub] = order[sub][np.lexsort((neg_dur[order[sub]], group))]
    del t
    return order[np.argsort(thread[order], kind="stable")]


def sorted_parents(
    start: np.ndarray, end: np.ndarray, thread: np.ndarray, rows: np.ndarray, native: bool | None = None
) -> np.ndarray:
    """Parents (as ``rows``) of events sorted by (thread, start, -duration): the compiled walk
    (:mod:`lmprof.trace._nest`) when it is built and finishes within its budget, else
    :func:`_jump_parents`; both give the same parents. ``native``: force (True) or skip (False) it."""
    if native is None:
        native = NATIVE
    n = len(start)
    if native and _nest is not None and n:
        new = np.concatenate(([False], thread[1:] != thread[:-1]))
        pos = np.empty(n, dtype=np.int64)
        done = _nest.parents(
            np.ascontiguousarray(start, dtype=np.float64), np.ascontiguousarray(end, dtype=np.float64),
            np.cumsum(new, dtype=np.int32), _END_SLACK_US, _NATIVE_STEPS_PER_EVENT * n + 1024, pos,
        )
        if done:
            root = pos < 0
            np.maximum(pos, 0, out=pos)  # in place: full-length temporaries are this step's peak
            got = rows[pos]
            got[root] = -1
            return got
    return _jump_parents(start, end, thread, rows)


def _jump_parents(start: np.ndarray, end: np.ndarray, thread: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Parents of events sorted by (thread, start, -duration), by vectorised pointer jumping.

    The parent of event i is the nearest earlier event c of its thread that is still open when i
    starts (end[c] > start[i]) and does not end before i (partial overlaps are not nesting). Every
    event keeps a candidate, first its predecessor; a candidate that fails is replaced by that
    candidate's parent (or its own candidate while unresolved). Everything skipped that way ended
    before the candidate started, hence before i started, so no parent is missed; skips double like
    in list ranking, so O(log n) vectorised rounds replace a per-event Python loop.
    """
    n = len(start)
    idx = np.int32 if n < 2**31 - 1 else np.int64
    # each event's thread starts at position ``first``: a candidate before it is another thread's
    first = np.zeros(n, dtype=idx)
    begins = np.flatnonzero(thread[1:] != thread[:-1]) + 1
    first[begins] = begins
    np.maximum.accumulate(first, out=first)
    cand = np.arange(-1, n - 1, dtype=idx)
    parent = np.full(n, -2, dtype=idx)  # -2: not yet known
    # the unresolved events with their candidate, thread start, start and end, kept side by side
    # and shrunk each round (gathering them from the full arrays every round costs more)
    todo, c, lo, s, e = np.arange(n, dtype=idx), cand.copy(), first, start, end
    del first
    while todo.size:
        root = c < lo
        ec = end[np.where(root, 0, c)]
        found = ec > s
        found &= ec + _END_SLACK_US >= e
        found &= ~root
        parent[todo[root]] = -1
        parent[todo[found]] = c[found]
        more = ~(root | found)
        del root, found, ec
        todo, c, lo, s, e = todo[more], c[more], lo[more], s[more], e[more]
        pc = parent[c]
        c = np.where(pc >= -1, pc, cand[c])
        cand[todo] = c
    del cand, todo
    # sorted positions -> table rows
    return np.where(parent >= 0, rows[np.maximum(parent, 0)], -1)


def enclosing(table: TraceTable, rows: np.ndarray, where: np.ndarray) -> np.ndarray:
    """For each row, the innermost host event strictly enclosing it with ``where[event]`` True.

    ``where`` is a boolean mask over ``table.events`` (e.g. annotations named ``lmprof:*``, or
    ``autograd::engine::evaluate_function:`` operators). Returns -1 where there is none. Rows that
    are not host events (kernels) have no enclosing events: pass their runtime call instead.
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(len(rows), -1, dtype=np.int64)
    par = parents(table)
    # climb from each row's parent until an event matches; only the asked rows' ancestors are
    # visited, one vectorised step per nesting level (nesting is shallow)
    at = np.flatnonzero(rows >= 0)
    hop = par[rows[at]]
    while at.size:
        live = hop >= 0
        at, hop = at[live], hop[live]
        hit = where[hop]
        out[at[hit]] = hop[hit]
        at, hop = at[~hit], par[hop[~hit]]
    return out


def _nearest_matching_ancestor(table: TraceTable, where: np.ndarray) -> np.ndarray:
    """For every row: itself if ``where`` holds, else the nearest matching ancestor, else -1."""
    par = parents(table)
    anc = np.where(where, np.arange(len(par)), -1)
    # resolve level by level (nesting depth is small), vectorised over all rows at each level
    pending = np.flatnonzero((anc < 0) & (par >= 0))
    hop = par[pending]
    while pending.size:
        found = anc[hop]
        anc[pending[found >= 0]] = found[found >= 0]
        more = (found < 0) & (par[hop] >= 0)
        pending, hop = pending[more], par[hop[more]]
    return anc


def depth(table: TraceTable) -> np.ndarray:
    """Nesting depth of each row on its thread (roots 0; device events 0)."""
    par = parents(table)
    out = np.zeros(len(par), dtype=np.int64)
    cur = par.copy()
    live = np.flatnonzero(cur >= 0)
    while live.size:
        out[live] += 1
        cur[live] = par[cur[live]]
        live = live[cur[live] >= 0]
    return out


def self_time(table: TraceTable) -> np.ndarray:
    """Duration minus the durations of direct children on the same thread (never below 0), us.

    Kept in the table's cache (read-only): the operator and annotation tables both ask."""
    cached = table.cache.get("self_time")
    if cached is None:
        cached = table.cache["self_time"] = _self_time(table)
        cached.setflags(write=False)
    return cached


def _self_time(table: TraceTable) -> np.ndarray:
    par = parents(table)
    dur = table.durations()
    child = par >= 0
    children = np.bincount(par[child], weights=dur[child], minlength=len(par))
    return np.maximum(dur - children, 0.0)
