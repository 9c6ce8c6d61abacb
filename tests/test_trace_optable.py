"""The operator table from a trace: torch's key_averages rule, per step, the median over steps.

Truths: torch's own ``key_averages()`` on the very profile whose trace lmprof reads (one step, so
mean and median agree), and a trace written event by event with figures chosen by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from lmprof.measure.profiling import op_table
from lmprof.trace.load import load_trace


def test_equals_torch_key_averages_on_one_step(tmp_path: Path) -> None:
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    m(x).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("ProfilerStep#1"):
            with record_function("lmprof:mlp.fc"):  # lmprof's own scopes are left out, as before
                m(x).sum().backward()  # aten::sum calls an aten::sum overload: torch folds the pair
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    torch_rows = {e.key: e for e in prof.key_averages() if not e.key.startswith(("ProfilerStep", "lmprof:"))}
    ours = {o.name: o for o in op_table(load_trace(path), 1, top=1000)}
    assert set(ours) == set(torch_rows)
    for name, e in torch_rows.items():
        o = ours[name]
        assert o.calls == e.count, name
        assert o.self_ms == pytest.approx(e.self_cpu_time_total / 1e3, abs=2e-6), name
        assert o.total_ms == pytest.approx(e.cpu_time_total / 1e3, abs=2e-6), name


def _op(name: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def test_median_over_steps_so_one_disturbed_step_cannot_reorder_the_table(tmp_path: Path) -> None:
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
           "ts": 1000.0 * i, "dur": 900.0, "args": {}} for i in range(1, 5)]
    ev += [_op("aten::mm", 1000.0 * i + 10, 120) for i in range(1, 4)]  # 120 us in each step ...
    ev += [_op("aten::empty", 1000.0 * i + 20, 20) for i in range(1, 4)]  # ... 20 of it in a child
    ev += [_op("aten::cat", 1000.0 * i + 200, 5) for i in (1, 3)]  # 5 us in steps 1 and 3,
    ev += [_op("aten::cat", 2200.0 + 10 * j, 8) for j in range(50)]  # 50 calls in the disturbed step 2
    ev += [_op("aten::add", 500.0, 999)]  # outside every step: left out
    ev += [_op("aten::mm", 4010.0, 999)]  # in step 4, past the counted 3: left out
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    rows = {o.name: o for o in op_table(load_trace(path), 3, top=10)}
    assert set(rows) == {"aten::mm", "aten::empty", "aten::cat"}
    assert (rows["aten::mm"].calls, rows["aten::mm"].self_ms, rows["aten::mm"].total_ms) == (1, 0.1, 0.12)
    assert (rows["aten::cat"].calls, rows["aten::cat"].self_ms) == (1, 0.005)  # the mean: 17 calls, 0.137 ms
    assert rows["aten::mm"].self_pct == pytest.approx(100 * 100 / 125)
