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


def test_a_typed_report_is_read_field_by_field_and_matches_the_trace():
    """A real trace's typed report (lmprof.trace.analyze.Report), read as it is, not through to_dict().
    Truth from the trace file: its kernel starts 45.426 µs after its cuLaunchKernel call starts and runs
    1.76 µs, shorter than that 47.768 µs call; three cpu_ops; one ProfilerStep of 13336.315805 ms."""
    from pathlib import Path

    from lmprof.trace.fanout import analyze_path

    report = analyze_path(Path(__file__).parent / "data" / "traces" / "a100_triton_kernel.json.gz")
    typed, as_json = trace_analysis(report), trace_analysis(report.to_dict())
    f = typed.facts
    assert f is not None and f.steps is not None and f.operators is not None and f.device is not None
    assert (f.steps.count, f.steps.median_ms) == (1, pytest.approx(13336.315805))
    assert (f.operators.count, f.operators.per_step) == (3, 3.0)
    assert f.device.launches.delay_median_us == pytest.approx(45.426, abs=1e-3)
    assert f.device.launches.short_kernels_pct == 100.0 and f.device.launches.linked == 1
    assert f.device.timeline is not None and f.device.timeline.span_us == pytest.approx(1.76, abs=1e-3)
    assert f.device.timeline.idle is None  # no idle gap in the window: no idle facts, not zeros
    assert as_json.facts is not None and as_json.facts.device is not None
    # the JSON form (floats rounded to ns) gives the same facts
    assert as_json.facts.device.launches.delay_median_us == pytest.approx(f.device.launches.delay_median_us, abs=1e-3)
    assert [o.name for o in as_json.facts.operators.top] == [o.name for o in f.operators.top]
    assert [o.share_pct for o in as_json.facts.operators.top] == pytest.approx([o.share_pct for o in f.operators.top],
                                                                              abs=1e-3)
    assert typed.report == report.to_dict()  # what a report shows is the JSON form


def test_a_figure_the_report_lacks_stays_missing_never_zero():
    from lmprof.show.trace_findings import describe_trace

    ta = trace_analysis(_report(temporal={"span_us": 1000.0, "idle_pct": None, "compute_pct": 60.0},
                                launches={"linked": 5, "launch_delay_median_us": None}))
    f = ta.facts
    assert f is not None and f.device is not None and f.device.timeline is not None
    assert f.device.timeline.idle_pct is None and f.device.timeline.memory_pct is None
    assert f.device.launches.delay_median_us is None and f.device.launches.short_kernels_pct is None
    assert "device_idle_pct" not in f.for_advice()  # a rule never reads a missing figure as 0
    text = " ".join(describe_trace(f))
    assert "moved memory n/a%" in text and "was idle n/a%" in text and "Median launch delay n/a µs" in text
    assert "computed 60.0%" in text
