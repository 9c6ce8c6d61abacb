"""Each ProfilerStep's dead window (issue 49, item 12), on a trace written event by event.

The ``ProfilerStep#*`` row gave only a mean and a maximum over the steps; which step stalled was
lost. The truths are the offsets written below: a step's start to its first operator, and to the
first device event launched from it (its runtime call starting inside the step).
"""
from __future__ import annotations

import json
import re

import pytest

from lmprof.trace.annotations import annotation_breakdown
from lmprof.trace.load import load_trace
from test_trace_synthetic import Trace


@pytest.fixture
def trace(tmp_path):
    tr = Trace()
    tr.step(1, 0, 100)
    tr.host("aten::mm", 30, 20)  # step 1: its first operator 30 us in
    tr.kernel("gemm", 50, 10, launch=(35, 3))  # launched at 35, runs at 50: 50 us from the step's start
    tr.step(2, 100, 100)
    tr.host("aten::relu", 110, 5)  # step 2: 10 us in
    tr.kernel("relu_kernel", 190, 5, launch=(112, 2))  # the device runs behind: 90 us
    tr.step(3, 200, 50)  # step 3: nothing inside
    return tr.write(tmp_path)


def test_each_step_has_its_own_dead_window(trace):
    an = annotation_breakdown(load_trace(trace))
    assert an is not None
    got = [(s.step, s.dead_us, s.first_op, s.to_first_kernel_us) for s in an.steps]
    assert got == [(1, pytest.approx(30.0), "aten::mm", pytest.approx(50.0)),
                   (2, pytest.approx(10.0), "aten::relu", pytest.approx(90.0)),
                   (3, None, None, None)]
    (row,) = [r for r in an.rows if r.name == "ProfilerStep#*"]
    assert row.dead_mean_us == pytest.approx(20.0) and row.dead_max_us == pytest.approx(30.0)  # the same windows


def test_the_table_and_the_json_show_every_step(cli, trace):
    code, out, err = cli("analyze", trace, "--json")
    assert code == 0, err
    (report,) = json.loads(out)["traces"]
    steps = report["annotations"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[1] == {"step": 2, "dead_us": pytest.approx(10.0), "first_op": "aten::relu",
                        "to_first_kernel_us": pytest.approx(90.0)}
    code, out, err = cli("analyze", trace)
    assert code == 0, err
    assert "Dead window per ProfilerStep" in out
    lines = {m.group(1): ln for ln in out.splitlines() if (m := re.match(r"^\W+(#\d+) ", ln))}
    assert "30.00 us" in lines["#1"] and "50.00 us" in lines["#1"]
    assert "10.00 us" in lines["#2"] and "90.00 us" in lines["#2"] and "aten::relu" in lines["#2"]
    assert "n/a" in lines["#3"]
