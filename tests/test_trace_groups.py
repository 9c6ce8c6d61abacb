"""The column statistics lmprof's trace analyses use instead of numpy's, checked against numpy's own.

``distinct``, ``median`` and ``percentile`` exist so that ``lmprof analyze`` does not import numpy.ma
(``np.unique``, ``np.median`` and ``np.percentile`` do); they must give numpy's values bit for bit.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lmprof.trace.groups import distinct, median, pair_codes, percentile

_FLOATS = hnp.arrays(np.float64, st.integers(1, 60),
                     elements=st.floats(-1e12, 1e12, allow_nan=False, allow_subnormal=False))


@settings(max_examples=300, deadline=None)
@given(_FLOATS, st.floats(0, 100))
def test_median_and_percentile_are_numpys(a, q):
    assert median(a) == float(np.median(a))
    for p in (q, 10, 90, 50, 0, 100):
        assert percentile(a, p) == float(np.percentile(a, p)), p


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.int64, st.integers(0, 60), elements=st.integers(-5, 5)))
def test_distinct_is_npunique_on_codes(a):
    assert np.array_equal(distinct(a), np.unique(a))
    if a.size:
        assert median(a) == float(np.median(a))
        assert percentile(a, 37.5) == float(np.percentile(a, 37.5))


def test_nan_and_empty():
    with_nan = np.array([3.0, np.nan, 1.0, np.nan, 2.0])
    assert np.array_equal(distinct(with_nan), np.unique(with_nan), equal_nan=True)
    assert np.isnan(median(with_nan)) and np.isnan(np.median(with_nan))
    assert np.isnan(percentile(with_nan, 10)) and np.isnan(np.percentile(with_nan, 10))
    assert np.isnan(median([])) and np.isnan(percentile([], 50))
    assert median([4, 1, 3, 2]) == 2.5 and percentile([1.0, 2.0], 90) == pytest.approx(1.9)


def test_analyze_does_not_import_numpy_ma(tmp_path):
    """Why the three exist: a whole `lmprof analyze --json` leaves numpy.ma (8 ms) unimported."""
    from pathlib import Path

    trace = Path(__file__).parent / "data" / "traces" / "v100_train_rank0.json.gz"
    # main() called with its arguments returns (the console script leaves at once when done)
    code = ("import sys\nfrom lmprof.cli.main import main\n"
            "assert main(['analyze', sys.argv[1], '--json']) == 0\n"
            "print('numpy.ma' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "False"


_IDS = st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1))


@settings(deadline=None)
@given(st.lists(st.tuples(_IDS, _IDS), max_size=80), st.booleans())
def test_pair_codes_number_pairs_in_pair_order(pairs, many):
    """(pid, tid) threads as one small code: equal pairs share a code, and codes follow the pairs'
    order (Python's tuple order, by hand), whatever the ids (negative text-id codes, int64 extremes).
    ``many`` adds enough distinct pairs that the codes no longer fit 16 bits."""
    if many:
        pairs = pairs + [(i, -i) for i in range(300)] + [(7, j) for j in range(300)]
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    got = pair_codes(a, b)
    assert got.shape == a.shape
    by_pair = sorted(range(len(pairs)), key=lambda i: pairs[i])
    for x, y in zip(by_pair, by_pair[1:]):  # in pair order: equal codes for equal pairs, else rising
        assert got[x] == got[y] if pairs[x] == pairs[y] else got[x] < got[y]
