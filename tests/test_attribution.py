"""Block attribution against traces written event by event, where the answer is known by hand."""
from __future__ import annotations

import json

import pytest

from lmprof.trace.attribution import attribute
from lmprof.trace.load import load_trace

EVAL = "autograd::engine::evaluate_function: "


def X(name, ts, dur, cat="cpu_op", tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def A(name, ts, dur, tid=1):
    return X(name, ts, dur, cat="user_annotation", tid=tid)


def one_step(bwd_tid: int = 1) -> list[dict]:
    """Step [0,100]: forward [10,50] with qkv [12,22] and mlp.fc [25,40]; backward [50,90]; optimizer [90,98]."""
    return [
        A("ProfilerStep#1", 0, 100),
        A("lmprof:forward", 10, 40),
        A("lmprof:attn.qkv", 12, 10),
        X("aten::addmm", 13, 7, **{"Sequence number": 5}),
        A("lmprof:mlp.fc", 25, 15),
        X("aten::dropout", 26, 1, **{"Sequence number": 6}),  # peeks at the counter, makes no node
        X("aten::mm", 28, 10, **{"Sequence number": 6}),
        A("lmprof:backward", 50, 40),
        X(EVAL + "MmBackward0", 52, 10, tid=bwd_tid, **{"Sequence number": 6}),
        X("MmBackward0", 53, 8, tid=bwd_tid, **{"Sequence number": 6}),
        X(EVAL + "AddmmBackward0", 63, 17, tid=bwd_tid, **{"Sequence number": 5}),
        X(EVAL + "torch::autograd::AccumulateGrad", 81, 2, tid=bwd_tid),
        A("lmprof:optimizer", 90, 8),
    ]


def write(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return load_trace(path)


@pytest.mark.parametrize("bwd_tid", [1, 7])  # CPU: backward on the caller's thread; CUDA: engine thread
def test_cpu_clock_by_hand(tmp_path, bwd_tid):
    att = attribute(write(tmp_path, one_step(bwd_tid)), clock="cpu")
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert got == {
        ("forward", "attn.qkv"): 10,
        ("forward", "mlp.fc"): 15,
        ("forward", "other"): 40 - 25,
        ("backward", "mlp.fc"): 10,
        ("backward", "attn.qkv"): 17,
        ("backward", "accumulate_grad"): 2,
        ("backward", "autograd_engine"): 40 - 29,  # the backward scope's own time: between nodes
        ("step", "optimizer"): 8,
        ("step", "other"): 100 - 40 - 40 - 8,
    }
    assert att.total_us() == pytest.approx(100)
    assert att.steps == 1 and att.step_us == [100]


def test_two_steps_are_averaged(tmp_path):
    second = [dict(e, ts=e["ts"] + 200) for e in one_step()]
    second[0]["name"] = "ProfilerStep#2"
    second[6]["args"]["Sequence number"] = 106  # a new step has new sequence numbers
    second[8]["args"]["Sequence number"] = 106
    second[9]["args"]["Sequence number"] = 106
    second[3]["args"]["Sequence number"] = 105
    second[10]["args"]["Sequence number"] = 105
    att = attribute(write(tmp_path, one_step() + second), clock="cpu")
    got = {(p.phase, p.name): (p.us, p.calls) for p in att.parts}
    assert got[("backward", "attn.qkv")] == (17, 1)
    assert att.total_us() == pytest.approx(100)


def test_device_clock_counts_kernels_and_idle(tmp_path):
    events = one_step()
    # A launch inside attn.qkv (forward) and one inside the AddmmBackward0 node (backward).
    events += [
        X("cudaLaunchKernel", 14, 2, cat="cuda_runtime", correlation=1),
        X("gemm_fwd", 20, 30, cat="kernel", pid=0, tid=7, correlation=1, stream=7, device=0),
        X("cudaLaunchKernel", 64, 2, cat="cuda_runtime", correlation=2),
        X("gemm_bwd", 66, 20, cat="kernel", pid=0, tid=7, correlation=2, stream=7, device=0),
    ]
    att = attribute(write(tmp_path, events))
    assert att.clock == "device"
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert got[("forward", "attn.qkv")] == 30
    assert got[("backward", "attn.qkv")] == 20
    assert got[("step", "idle")] == 100 - 50
    assert att.total_us() == pytest.approx(100)


def test_unmapped_backward_node_is_other_and_noted(tmp_path):
    events = one_step()
    events[10]["args"]["Sequence number"] = 999
    att = attribute(write(tmp_path, events), clock="cpu")
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert ("backward", "attn.qkv") not in got
    assert got[("backward", "other")] == 17  # the node no block claims
    assert got[("backward", "autograd_engine")] == 40 - 29  # the engine between nodes, as before
    assert any("no forward op" in n for n in att.notes)


def test_trace_without_step_annotations_is_one_window(tmp_path):
    events = [e for e in one_step() if not e["name"].startswith("ProfilerStep")]
    att = attribute(write(tmp_path, events), clock="cpu")
    assert att.steps == 1
    assert att.step_us == [98 - 10]


def test_device_clock_backward_on_the_engine_thread(tmp_path):
    """On CUDA the autograd engine runs backward nodes on its own thread: kernels launched there
    still belong to the node's block; launches on that thread outside any node are the engine's."""
    events = one_step(bwd_tid=7)
    events += [
        X("cudaLaunchKernel", 14, 2, cat="cuda_runtime", correlation=1),
        X("gemm_fwd", 20, 30, cat="kernel", pid=0, tid=9, correlation=1),
        X("cudaLaunchKernel", 64, 2, cat="cuda_runtime", tid=7, correlation=2),  # inside AddmmBackward0
        X("gemm_bwd", 66, 20, cat="kernel", pid=0, tid=9, correlation=2),
        X("cudaLaunchKernel", 84, 1, cat="cuda_runtime", tid=7, correlation=3),  # engine thread, no node
        X("memset", 86, 3, cat="gpu_memset", pid=0, tid=9, correlation=3),
    ]
    att = attribute(write(tmp_path, events))
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert got[("forward", "attn.qkv")] == 30
    assert got[("backward", "attn.qkv")] == 20
    assert got[("backward", "autograd_engine")] == 3 and ("backward", "other") not in got
    assert got[("step", "idle")] == 100 - 53
    assert att.total_us() == pytest.approx(100)


def test_the_operators_of_the_unclaimed_time_are_named_with_their_time(tmp_path):
    """The step's own work (an EMA update between the optimizer and the next forward) and the forward's time in
    no block: the operators called directly in each ``other``, by name, children included, largest first."""
    events = one_step() + [
        X("aten::_foreach_lerp_", 2, 5),  # in the step, before the forward: 5 us
        X("aten::copy_", 3, 1),  # inside the lerp: its child, not listed on its own
        X("aten::randn", 8, 1),  # 1 us
        X("aten::_foreach_lerp_", 98.5, 1),  # a second call, after the optimizer
        X("aten::add", 45, 3),  # in the forward, in no block: 3 us
        X("aten::mul", 91, 2, tid=2),  # another thread's, in no range of this step: not listed
    ]
    att = attribute(write(tmp_path, events), clock="cpu")
    total, ops = att.other_ops[("other", "step")]
    assert ops == [("aten::_foreach_lerp_", 6.0), ("aten::randn", 1.0)] and total == 7.0
    assert att.other_ops[("other", "forward")] == (3.0, [("aten::add", 3.0)])
    assert set(att.other_ops) == {("other", "step"), ("other", "forward")}  # only the unclaimed rows
