"""CUDA-graph launches and device work lmprof does not analyse (issue 13 §7), on traces written event by event."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.analyze import NO_DEVICE, analyze_table
from lmprof.trace.load import load_trace
from test_trace_synthetic import T0, Trace

DATA = Path(__file__).parent / "data" / "traces"


def _graph_trace() -> Trace:
    """Two graph launches of 3 kernels each, and 2 kernels launched one by one.

    graph call A: ts 0, dur 8 -> kernels 20..22, 22..23, 23..26 (durations 2, 1, 3: all shorter than 8)
    graph call B: ts 30, dur 6 -> kernels 40..41, 41..43, 43..44 (durations 1, 2, 1)
    single 1: call ts 50 dur 4 -> kernel 60..62 (2 < 4: short), launch delay 10
    single 2: call ts 70 dur 4 -> kernel 90..100 (10 >= 4: not short), launch delay 20
    """
    tr = Trace()
    for start, dur, kernels in ((0, 8, [(20, 2), (22, 1), (23, 3)]), (30, 6, [(40, 1), (41, 2), (43, 1)])):
        corr = tr.runtime("cudaGraphLaunch", start, dur)
        for i, (ts, kd) in enumerate(kernels):
            tr.device(f"graph_kernel_{i}", ts, kd, corr=corr)
    tr.kernel("single_a", 60, 2, launch=(50, 4))
    tr.kernel("single_b", 90, 10, launch=(70, 4))
    return tr


def test_graph_launch_counted_once_and_apart(tmp_path):
    la = analyze_table(load_trace(_graph_trace().write(tmp_path))).device.launches
    assert la.kernels == 8
    assert la.graph_launches == 2 and la.graph_kernels == 6
    assert la.graph_kernels_time_us == pytest.approx(2 + 1 + 3 + 1 + 2 + 1)
    assert la.graph_launch_call_median_us == pytest.approx(7.0)  # median of 8 and 6
    assert la.graph_kernels_per_launch_max == 3
    # the per-kernel figures cover the two kernels launched one by one only
    assert la.linked == 2
    assert la.short_kernels == 1 and la.short_kernels_pct == pytest.approx(50.0)
    assert la.short_kernels_time_us == pytest.approx(2.0)
    assert la.launch_delay_median_us == pytest.approx(15.0) and la.launch_delay_max_us == pytest.approx(20.0)
    assert la.launch_call_median_us == pytest.approx(4.0)


def test_one_call_many_kernels_is_a_graph_whatever_its_name(tmp_path):
    tr = Trace()
    corr = tr.runtime("cudaLaunchSomethingNew", 0, 5)
    tr.device("k0", 10, 1, corr=corr)
    tr.device("k1", 11, 1, corr=corr)
    tr.kernel("k2", 20, 1, launch=(12, 5))
    la = analyze_table(load_trace(tr.write(tmp_path))).device.launches
    assert (la.graph_launches, la.graph_kernels, la.linked, la.short_kernels) == (1, 2, 1, 1)


def test_graph_launches_in_terminal_output(tmp_path, capsys):
    assert main(["analyze", str(_graph_trace().write(tmp_path))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "graph launches: 2 calls launched 6 kernels" in out
    assert "kernels shorter than their launch call: 1 (50.0%)" in out


def _mtia_like(tmp_path: Path) -> Path:
    """Host ops plus device work in a category lmprof does not know (MTIA's mtia_ccp_events)."""
    tr = Trace()
    tr.host("aten::mm", 0, 10)
    tr.host("launch", 2, 3, cat="mtia_runtime", correlation=5)
    for i in range(3):
        event = {"ph": "X", "cat": "mtia_ccp_events", "name": "job_exe", "pid": 17, "tid": 3774,
                 "ts": T0 + 20 + 10 * i, "dur": 5, "args": {"stream": 108, "seq_num": i}}  # fmt: skip
        tr.events.append(event)
    return tr.write(tmp_path)


def test_unknown_device_category_is_named_not_silent(tmp_path, capsys):
    rep = analyze_table(load_trace(_mtia_like(tmp_path)))
    assert rep.device is None and rep.unsupported_device_events == {"mtia_ccp_events": 3}
    assert rep.device_note != NO_DEVICE
    assert "3 mtia_ccp_events" in rep.device_note and "does not analyse" in rep.device_note
    # device work is not host work: the host span is the host events' only (0..10)
    assert rep.host_span_us == pytest.approx(10.0)
    assert main(["analyze", str(tmp_path / "trace.json")]) == 0
    assert "3 mtia_ccp_events" in " ".join(capsys.readouterr().out.split())


def test_unknown_device_category_next_to_gpu_work_is_a_note(tmp_path):
    tr = Trace()
    tr.kernel("gemm", 10, 5, launch=(0, 3))
    tr.events.append({"ph": "X", "cat": "xpu_thing", "name": "op", "pid": 3, "tid": 1, "ts": T0, "dur": 1,
                      "args": {}})  # fmt: skip
    rep = analyze_table(load_trace(tr.write(tmp_path)))
    assert rep.device is not None and rep.unsupported_device_events == {"xpu_thing": 1}
    assert any("1 xpu_thing" in n for n in rep.notes)


def test_real_mtia_trace_slice():
    rep = analyze_table(load_trace(DATA / "mtia_inference_slice.json.gz"))
    assert rep.device is None
    assert set(rep.unsupported_device_events) == {"mtia_ccp_events"}
    assert "mtia_ccp_events" in rep.device_note


def test_known_traces_have_no_unsupported_device_events():
    for f in sorted(DATA.glob("*.json.gz")):
        if "mtia" not in f.name:
            assert analyze_table(load_trace(f)).unsupported_device_events == {}, f.name




def test_a_graph_workload_is_not_told_to_use_cuda_graphs(tmp_path):
    from lmprof.analysis.advice import advise
    from lmprof.show.trace_findings import findings_from_analysis
    from lmprof.trace.analyze import combine
    from test_advice import blk, make_run

    rep = combine([analyze_table(load_trace(_graph_trace().write(tmp_path)))])
    found = findings_from_analysis(rep)
    assert found.facts["graph_launches"] == 2
    assert any("already uses CUDA graphs" in s for s in found.findings)
    run = make_run(device="cuda:0", blocks=[blk("idle", 35, "step"), blk("mlp.fc", 65)])
    without = {r.rule: r for r in advise(run, {"device_idle_pct": 50.0})}["overhead_bound"]
    assert any("CUDA graphs" in a for a in without.actions)
    with_graphs = {r.rule: r for r in advise(run, {**found.facts, "device_idle_pct": 50.0})}["overhead_bound"]
    assert not any("CUDA graphs" in a for a in with_graphs.actions)
