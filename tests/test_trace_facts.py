"""analysis/trace_facts.py: typed facts from an lmprof.analyze/1 report, checked against hand arithmetic."""
from __future__ import annotations

import pytest

from lmprof.analysis.trace_facts import Share, TraceAnalysis, analyze_run_trace, trace_analysis
from lmprof.record.run import Env, Run


def _report(**device):
    return {"traces": [{
        "steps": {"count": 4, "median_ms": 10.0, "min_ms": 9.0, "max_ms": 12.0},
        "operators": {"count": 1000, "top": [{"name": "aten::mm", "share_pct": 50.0}]},
        "device": device or None, "device_note": "no device activity in trace",
    }, {"steps": {"count": 1}}], "notes": ["n1"]}


def test_facts_of_a_gpu_trace_are_hand_arithmetic():
    ta = trace_analysis(_report(
        temporal={"span_us": 8000.0, "idle_pct": 25.0, "compute_pct": 70.0, "memory_pct": 5.0},
        idle={"gaps": 3, "sync_us": 800.0, "host_bound_us": 400.0, "sync_gaps": 1, "host_bound_gaps": 2},
        launches={"graph_launches": 2, "graph_kernels": 10}, kernels={"top": [{"name": "k", "share_pct": 9.0}]}))
    assert ta.available and ta.traces == 2 and ta.notes == ("n1",)
    f = ta.facts
    assert f is not None and f.device is not None and f.device.timeline is not None
    assert f.operators is not None and f.operators.per_step == 250.0  # 1000 calls / 4 steps
    assert f.device.timeline.idle is not None
    assert f.device.timeline.idle.sync_pct == pytest.approx(10.0)  # 800 / 8000 µs
    assert f.device.timeline.idle.host_bound_pct == pytest.approx(5.0)  # 400 / 8000 µs
    assert f.device.top_kernels == (Share("k", 9.0),)
    assert f.for_advice() == pytest.approx({"ops_per_step": 250.0, "device_idle_pct": 25.0, "sync_idle_pct": 10.0,
                                            "host_bound_idle_pct": 5.0, "graph_launches": 2.0})


def test_a_cpu_trace_gives_no_device_facts_and_an_unknown_shape_none():
    ta = trace_analysis(_report())
    assert ta.facts is not None and ta.facts.device is None
    assert ta.facts.device_note == "no device activity in trace"
    assert ta.facts.for_advice() == {"ops_per_step": 250.0}
    odd = trace_analysis({"findings": ["x"]})
    assert odd.available and odd.facts is None and odd.report == {"findings": ["x"]}


def test_a_run_without_a_trace_says_why(tmp_path):
    run = Run(id="r", mode="train", created="x", env=Env(device="cpu", device_name="cpu", torch="2", python="3", lmprof="0",
                                                    os="linux", cpu="cpu", threads=1), config={})
    assert analyze_run_trace(run) == TraceAnalysis(False, "no trace file in this run")
