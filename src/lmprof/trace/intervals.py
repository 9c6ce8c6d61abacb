"""Interval arithmetic on numpy arrays: unions, and a sweep that labels every stretch of time.

Times are float microseconds. Zero-length intervals add nothing to any total.
"""
from __future__ import annotations

import numpy as np

from lmprof.trace.records import Record


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted disjoint ones (touching ones merge too)."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # a new group starts where an interval begins after everything before it has ended
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = union(starts, ends)
    return float((e - s).sum())


class Sweep(Record, frozen=True):
    """Consecutive segments ``[start[i], start[i] + length[i])`` with the set of labels active.

    ``state`` is a bit mask: bit ``k`` set when at least one interval with label ``k`` covers the
    segment. Segments cover [first start, last end] without holes; idle segments have state 0.
    """

    start: np.ndarray
    length: np.ndarray
    state: np.ndarray

    def time_by_state(self, n_labels: int) -> np.ndarray:
        """Total length of each state 0 .. 2**n_labels - 1."""
        return np.bincount(self.state, weights=self.length, minlength=1 << n_labels)


def sweep(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray, n_labels: int) -> Sweep:
    """Split the time covered by the intervals into segments labelled by which labels are active."""
    n = len(starts)
    if n == 0:
        return Sweep(np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))
    times = np.concatenate([starts, ends])
    order = np.argsort(times, kind="stable")
    times = times[order]
    lab = np.concatenate([labels, labels])[order]
    sign = np.concatenate([np.ones(n, dtype=np.int32), -np.ones(n, dtype=np.int32)])[order]
    state = np.zeros(2 * n, dtype=np.int64)
    for k in range(n_labels):
        active = np.cumsum(np.where(lab == k, sign, 0), dtype=np.int64)
        state |= (active > 0).astype(np.int64) << k
    # the state after boundary i holds until boundary i + 1
    return Sweep(times[:-1], np.diff(times), state[:-1])
