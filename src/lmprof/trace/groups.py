"""Group-by on numpy columns: what the analyses asked of pandas' ``groupby``, without pandas; and the
distinct values, median and percentiles of a column.

Groups are numbered 0..n-1 (:func:`group_by`); each aggregate returns one value per group.
Float sums are compensated (``math.fsum``, exactly rounded), as pandas' group sums are (Kahan), so
a sum of many durations does not drift with their order; integer sums are exact.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a numeric array, as ``np.unique(values)`` (NaNs as one).

    Not ``np.unique`` itself: its plain form asks ``np.ma.is_masked`` first, which imports numpy.ma
    (8 ms, a twentieth of ``lmprof analyze``'s start-up) for arrays that are never masked.
    """
    s = np.sort(values.ravel())
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    if s.dtype.kind in "fc":
        keep[1:] &= ~(np.isnan(s[1:]) & np.isnan(s[:-1]))  # NaNs sort last: keep the first
    return s[keep]


def median(values: Any) -> float:
    """``float(np.median(values))`` for a 1-d sequence of numbers: the middle value, or the mean of
    the two middle values (``(a + b) / 2``, as numpy computes it); NaN if any value is NaN or there are none.

    Not ``np.median`` itself: it asks ``np.ma.isMaskedArray`` of its result, which imports numpy.ma
    (8 ms of ``lmprof analyze``'s start-up) for arrays that are never masked.
    """
    a = _numbers(values)
    if a is None:
        return math.nan
    n = a.size
    k = n // 2
    if n % 2:
        return float(np.partition(a, k)[k])
    part = np.partition(a, (k - 1, k))
    return float((part[k - 1] + part[k]) / 2)


def percentile(values: Any, q: float) -> float:
    """``float(np.percentile(values, q))`` (numpy's default 'linear' method, its arithmetic) for a 1-d
    sequence of numbers; NaN if any value is NaN or there are none. Not numpy's own for the reason
    :func:`median` gives (``np.percentile`` imports numpy.ma through ``np.unique``)."""
    a = _numbers(values)
    if a is None:
        return math.nan
    n = a.size
    at = (n - 1) * (q / 100)
    lo = min(max(math.floor(at), 0), n - 1)
    hi = min(lo + 1, n - 1)
    part = np.partition(a, (lo, hi))
    x, y, t = part[lo], part[hi], at - lo
    d = y - x
    return float(y - d * (1 - t)) if t >= 0.5 else float(x + d * t)


def _numbers(values: Any) -> np.ndarray | None:
    """``values`` as a flat float64 array, or None when there are none or any is NaN (numpy's
    median and percentiles are NaN then)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    return None if a.size == 0 or np.isnan(a).any() else a


def group_by(keys: np.ndarray, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys and each row's group number.

    ``sort``: groups in key order (pandas' ``sort=True``), else in order of first appearance
    (``sort=False``).
    """
    if keys.dtype == object or keys.size < 2:
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        # numbers: the distinct values are those of the runs' first elements (a trace's thread and
        # process ids come in long runs), so only those are sorted; rows find theirs by bisection
        heads = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        uniq, at = np.unique(keys[heads], return_index=True)
        first = heads[at]
        inverse = np.searchsorted(uniq, keys)
    if sort:
        return uniq, inverse
    rank = np.empty(len(uniq), dtype=np.int64)
    order = np.argsort(first, kind="stable")
    rank[order] = np.arange(len(uniq))
    return uniq[order], rank[inverse]


def factorize(values: np.ndarray, sort: bool = False) -> np.ndarray:
    """Each value's number among the distinct values: in order of first appearance (pandas'
    ``factorize``), or in value order with ``sort``."""
    return group_by(values, sort)[1]


def pair_codes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Each row's (first, second) pair as a small integer, numbered in pair order (16 bits when the
    codes fit: numpy sorts those stably by radix, in one pass). For threads as (pid, tid): one
    short key where two int64 columns were gathered, reordered and compared."""
    key = factorize(first, sort=True).astype(np.int64, copy=False)
    second_code = factorize(second, sort=True)
    key *= int(second_code.max(initial=0)) + 1  # in place: these are full-length arrays
    key += second_code
    if key.size and key.max() < 2**16:
        return key.astype(np.uint16)
    return key


def _bounds(group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by group (stable: each group's rows keep their order) and each group's slice."""
    order = np.argsort(group, kind="stable")
    return order, np.searchsorted(group[order], np.arange(n + 1))


def group_sizes(group: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(group, minlength=n).astype(np.int64)


def group_first(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Each group's value at its first row."""
    order, bounds = _bounds(group, n)
    return values[order[bounds[:-1]]]


def group_fsum(group: np.ndarray, n: int, values: np.ndarray, skip_nan: bool = False) -> np.ndarray:
    """Compensated float sum per group (0.0 for an empty one); ``skip_nan`` leaves NaN values out."""
    order, bounds = _bounds(group, n)
    vals = values[order].astype(np.float64, copy=False)
    out = np.zeros(n)
    for g in range(n):
        part = vals[bounds[g] : bounds[g + 1]]
        if skip_nan:
            part = part[~np.isnan(part)]
        out[g] = math.fsum(part.tolist())
    return out


def group_nanmean(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Mean of the non-NaN values per group (NaN when there is none)."""
    counts = np.bincount(group[~np.isnan(values)], minlength=n)
    sums = group_fsum(group, n, values, skip_nan=True)
    out = np.full(n, np.nan)
    has = counts > 0
    out[has] = sums[has] / counts[has]
    return out


def group_nanmax(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Largest non-NaN value per group (NaN when there is none)."""
    out = np.full(n, -np.inf)
    ok = ~np.isnan(values)
    np.maximum.at(out, group[ok], values[ok])
    out[np.bincount(group[ok], minlength=n) == 0] = np.nan
    return out


def group_isum(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Exact integer sum per group (int64)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, group, values.astype(np.int64, copy=False))
    return out
