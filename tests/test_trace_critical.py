"""Critical path and what-if (issue 19) on traces written event by event; paths worked out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.analyze import analyze_table
from lmprof.trace.load import load_trace
from test_trace_synthetic import Trace

DATA = Path(__file__).parent / "data" / "traces"


def _cp(tr: Trace, tmp_path: Path):
    return analyze_table(load_trace(tr.write(tmp_path))).critical_path


def test_launch_queue_and_sync(tmp_path):
    tr = Trace()
    tr.step(1, 0, 100)
    tr.step(2, 100, 100)  # the last step is left out, like the device window
    tr.kernel("k1", 20, 30, launch=(10, 5))  # launch latency 15 -> 20: 5 us
    tr.kernel("k2", 50, 40, launch=(20, 5))  # queued behind k1 (launch ended at 25)
    tr.runtime("cudaDeviceSynchronize", 30, 62)  # 30..92: returns 2 us after k2 ends at 90
    cp = _cp(tr, tmp_path)
    assert [p.step for p in cp.steps] == [1]
    seg = cp.steps[0].segments_us
    # back from 100: host 92..100, sync 90..92, k2 50..90, k1 20..50, latency 15..20, launch call 10..15, host 0..10
    assert seg["cpu"] == pytest.approx(18) and seg["sync"] == pytest.approx(2)
    assert seg["computation"] == pytest.approx(70) and seg["launch_latency"] == pytest.approx(5)
    assert seg["launch_call"] == pytest.approx(5) and seg["device_wait"] == pytest.approx(0)
    assert sum(seg.values()) == pytest.approx(100) == cp.steps[0].step_us
    assert cp.steps[0].kernels_on_path == 2
    ifs = {w.change: w for w in cp.what_if}
    assert cp.step_ms == pytest.approx(0.1)
    assert ifs["launch overhead to zero"].step_ms == pytest.approx(0.09)  # minus 5 + 5 us
    assert cp.top_kernel == "k2" and ifs["top kernel 2x faster"].step_ms == pytest.approx(0.08)  # minus 20 us
    assert ifs["communication fully overlapped"].saving_pct == pytest.approx(0)


def test_device_work_past_the_host_step_and_cross_stream_wait(tmp_path):
    tr = Trace()
    tr.step(1, 0, 20)  # the host is done at 20; its device work runs until 60
    tr.kernel("k1", 10, 30, stream=7, launch=(0, 5))
    tr.kernel("ncclDevKernel_AllReduce", 45, 15, stream=8, launch=(6, 2))  # waits for k1 (event), 40..45
    cp = _cp(tr, tmp_path)
    seg = cp.steps[0].segments_us
    assert cp.steps[0].step_us == pytest.approx(60)
    assert seg["communication"] == pytest.approx(15) and seg["cross_stream"] == pytest.approx(5)
    assert seg["computation"] == pytest.approx(30) and seg["launch_latency"] == pytest.approx(5)
    assert seg["launch_call"] == pytest.approx(5) and sum(seg.values()) == pytest.approx(60)
    comm = next(w for w in cp.what_if if w.change.startswith("communication"))
    assert comm.step_ms == pytest.approx(0.045)


def test_no_steps_no_path(tmp_path):
    tr = Trace()
    tr.kernel("k", 10, 5, launch=(0, 3))
    assert _cp(tr, tmp_path) is None


def test_real_traces_paths_cover_each_step(capsys):
    for name in ("v100_train_rank0", "a100_nccl_rank0", "amd_mi250_train", "a100_alexnet_cuda_sync"):
        cp = analyze_table(load_trace(DATA / f"{name}.json.gz")).critical_path
        if cp is None:  # alexnet has no ProfilerStep annotations
            continue
        for p in cp.steps:
            assert sum(p.segments_us.values()) == pytest.approx(p.step_us, rel=1e-6, abs=1e-3), name
    v100 = analyze_table(load_trace(DATA / "v100_train_rank0.json.gz")).critical_path
    # device-bound: the host runs ahead, each later step first waits for the previous step's kernels
    for p in v100.steps[1:]:
        own = p.step_us - p.segments_us["previous_step"]
        assert p.segments_us["previous_step"] > 0 and p.segments_us["computation"] / own > 0.95
        # HTA 0.5 (critical_path_analysis, same trace, steps 102-104) sums its path to 95,735 /
        # 95,569 / 95,662 us; this path without the previous step's work is within 3 us of it
        assert 95_000 < own < 96_000
    assert main(["analyze", str(DATA / "v100_train_rank0.json.gz")]) == 0
    assert "Critical path of 4 step(s)" in " ".join(capsys.readouterr().out.split())


def test_device_still_busy_with_the_previous_step(tmp_path):
    tr = Trace()
    tr.step(1, 0, 10)
    tr.kernel("k_old", 5, 45, launch=(1, 2))  # launched in step 1, runs 5..50
    tr.step(2, 10, 10)
    tr.kernel("k_new", 50, 20, launch=(12, 2))  # launched in step 2, queued behind k_old
    tr.step(3, 20, 100)  # last step: left out
    cp = _cp(tr, tmp_path)
    s2 = next(p for p in cp.steps if p.step == 2)
    # step 2 spans 10..70: k_new 50..70 on the path, then the device was busy with step 1's work
    assert s2.step_us == pytest.approx(60)
    assert s2.segments_us["computation"] == pytest.approx(20)
    assert s2.segments_us["previous_step"] == pytest.approx(40) and s2.kernels_on_path == 1


def test_kernels_shorter_than_the_rounding_tolerance_do_not_loop(tmp_path):
    """Two overlapping kernels on two streams, each shorter than the 1e-6 us the walk allows for
    rounding: each "ended before" the other started, and the walk used to go round them until its
    1 M-step cap (kernels_on_path 1,000,000, cross-stream 39.6 us). By hand, back from 60: C 50..60
    (computation), waiting on B's stream since B ended at 10.0000005 (cross-stream ~40), B waits
    for A, A for its launch (latency 2..10, the call 1..2, the host before it 0..1). All three are
    launched in the trace: with one step, a device event launched before the trace began is not the
    step's (timeline.py)."""
    tr = Trace()
    tr.step(1, 0, 20)
    tr.kernel("A", 10.0, 0.0000004, stream=7, launch=(1, 1))
    tr.kernel("B", 10.0000001, 0.0000004, stream=8, launch=(3, 1))
    tr.kernel("C", 50, 10, stream=9, launch=(5, 1))
    step = _cp(tr, tmp_path).steps[0]
    seg = step.segments_us
    assert step.kernels_on_path == 3 and step.step_us == pytest.approx(60)
    assert seg["computation"] == pytest.approx(10, abs=1e-5) and seg["cross_stream"] == pytest.approx(40, abs=1e-5)
    assert seg["launch_latency"] == pytest.approx(8, abs=1e-5) and seg["launch_call"] == pytest.approx(1)
    assert seg["cpu"] == pytest.approx(1) and sum(seg.values()) == pytest.approx(60)
