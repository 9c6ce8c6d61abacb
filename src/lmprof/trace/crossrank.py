"""The critical path across ranks: which rank each collective on a rank's path waited for.

A collective cannot finish on any rank before the last rank has joined it, so the part of a
collective kernel that ran before the last rank's matching kernel started is time spent waiting
for that rank: on the job's critical path, that stretch belongs to the late rank's own work before
the collective, not to communication. For each step and rank this module takes the communication
kernels on the rank's own critical path (:mod:`lmprof.trace.critical`), matches each to the same
collective on the other ranks (:func:`lmprof.trace.comms.call_keys`: process group, kind and
sequence number, or the k-th such call when sequence numbers are missing), and splits its time on
the path into

* ``rank_wait_us``: from the kernel's start to the start of the last rank's matching kernel (at most
  its time on the path), credited to that rank in ``waited_for``;
* the rest, transfer.

Per step, the ``critical_rank`` is the rank the others waited for longest (None when nobody
waited): the job's path runs through it. ``balanced_step_ms`` is the what-if "no rank waits for
another": per step the largest of the ranks' path minus its waiting, median over steps. Like every
what-if it is optimistic.

Assumption, said in the report: the ranks' trace clocks agree (one host, or hosts with synchronised
clocks); a clock offset between hosts reads as waiting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmprof.trace.comms import Communication, call_keys, matched_by_seq
from lmprof.trace.critical import CriticalPath
from lmprof.trace.groups import median

CLOCK_NOTE = (
    "ranks' trace clocks are taken to agree (one host or synchronised clocks): "
    "an offset between hosts would read as waiting"
)


@dataclass(frozen=True)
class RankStepPath:
    """One rank's critical path in one step, with its waiting for other ranks."""

    step: int
    rank: int
    path_us: float  # the rank's critical path (its step length)
    rank_wait_us: float  # of it, inside collectives before the last rank joined them
    waited_for: dict[str, float]  # rank (as text) -> us of rank_wait_us spent waiting for it


@dataclass(frozen=True)
class StepAcrossRanks:
    step: int
    step_us: float  # the longest of the ranks' paths
    critical_rank: int | None  # the rank the others waited for longest; None when nobody waited
    balanced_us: float  # largest (path - waiting) over the ranks: the step if nobody waited


@dataclass(frozen=True)
class CrossRankPath:
    """Critical paths of several ranks linked through their collectives."""

    rows: list[RankStepPath]
    steps: list[StepAcrossRanks]
    step_ms: float  # median over steps of the longest path
    balanced_step_ms: float  # what if no rank waited for another (optimistic)
    matched_by: str  # "sequence number" | "order"
    collectives_linked: int  # collectives on some rank's path matched on every rank
    note: str = CLOCK_NOTE


def cross_rank_path(per_rank: list[tuple[int, CriticalPath | None, Communication | None]]) -> CrossRankPath | None:
    """Link the ranks' critical paths; None unless two or more ranks have paths and collectives."""
    ranks = [(r, cp, c) for r, cp, c in per_rank if cp is not None and cp.steps and c is not None and c.calls]
    if len(ranks) < 2:
        return None
    by_seq = matched_by_seq([c for _, _, c in ranks])
    # per rank: row -> key, and key -> earliest start of the collective's kernels on that rank
    row_key: dict[int, dict[int, tuple[Any, ...]]] = {}
    starts: dict[tuple[Any, ...], dict[int, float]] = {}
    for r, _, c in ranks:
        keys = call_keys(c, by_seq)
        row_key[r] = {x.row: k for x, k in zip(c.calls, keys)}
        for x, k in zip(c.calls, keys):
            seen = starts.setdefault(k, {})
            seen[r] = min(seen.get(r, np.inf), x.start_us)
    everyone = {r for r, _, _ in ranks}
    rows: list[RankStepPath] = []
    linked: set[tuple[Any, ...]] = set()
    for r, cp, _ in ranks:
        assert cp is not None
        for p in cp.steps:
            waited: dict[str, float] = {}
            for row, start, on_path in p.collectives:
                key = row_key[r].get(row)
                if key is None or set(starts[key]) != everyone:
                    continue  # outside the device window, or not seen on every rank: nothing to link
                when = starts[key]
                linked.add(key)
                last = max(when, key=lambda q: (when[q], q))
                wait = min(max(when[last] - start, 0.0), on_path)
                if last != r and wait > 0:
                    waited[str(last)] = waited.get(str(last), 0.0) + wait
            rows.append(RankStepPath(p.step, r, p.step_us, sum(waited.values()), waited))
    steps = _steps(rows)
    longest = [s.step_us for s in steps]
    balanced = [s.balanced_us for s in steps]
    return CrossRankPath(
        rows=sorted(rows, key=lambda x: (x.step, x.rank)),
        steps=steps,
        step_ms=median(longest) / 1e3 if longest else 0.0,
        balanced_step_ms=median(balanced) / 1e3 if balanced else 0.0,
        matched_by="sequence number" if by_seq else "order",
        collectives_linked=len(linked),
    )


def _steps(rows: list[RankStepPath]) -> list[StepAcrossRanks]:
    out = []
    for step in sorted({x.step for x in rows}):
        mine = [x for x in rows if x.step == step]
        blame: dict[int, float] = {}
        for x in mine:
            for q, us in x.waited_for.items():
                blame[int(q)] = blame.get(int(q), 0.0) + us
        critical = max(blame, key=lambda q: (blame[q], -q)) if blame else None
        out.append(
            StepAcrossRanks(
                step=step,
                step_us=max(x.path_us for x in mine),
                critical_rank=critical,
                balanced_us=max(x.path_us - x.rank_wait_us for x in mine),
            )
        )
    return out
