"""Compiled graphs' kernels named by their blocks: traces written event by event, answers by hand."""
from __future__ import annotations

import inspect
import json

import pytest

from lmprof.trace.attribution import attribute
from lmprof.trace.compiled import extern_op_name, kernel_blocks
from lmprof.trace.load import load_trace

CALL = "## Call CompiledFxGraph fabc ##"
BWD_CALL = "## Call CompiledFxGraph fdef ##"

# What compile time recorded: forward graph (ln + qkv matmul, then a fused kernel of two blocks,
# then the fc matmul) and a backward graph (a fused kernel of two blocks, one matmul). The fused
# kernels carry the shares compile time weighed (1:4 and 1:3 by bytes).
GRAPHS = [
    {"kernels": [{"name": "cpp_fused_native_layer_norm_0", "extern": False, "blocks": ["ln_1"]},
                 {"name": "addmm", "extern": True, "blocks": ["attn.qkv"]},
                 {"name": "cpp_fused_gelu_view_1", "extern": False, "blocks": ["mlp.fc", "mlp.act"],
                  "shares": [0.2, 0.8], "basis": "bytes"},
                 {"name": "addmm", "extern": True, "blocks": ["mlp.fc"]}]},
    {"kernels": [{"name": "cpp_fused_sum_0", "extern": False, "blocks": ["mlp.act", "mlp.proj"],
                  "shares": [0.25, 0.75], "basis": "bytes"},
                 {"name": "mm", "extern": True, "blocks": ["mlp.fc"]}]},
]


def X(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": {}}


def A(name, ts, dur, tid=1):
    return X(name, ts, dur, cat="user_annotation", tid=tid)


def compiled_step() -> list[dict]:
    """Step [0,100]: forward [10,50] running the forward graph [12,48]; backward [50,90]."""
    return [
        A("ProfilerStep#1", 0, 100),
        A("lmprof:forward", 10, 40),
        A(CALL, 12, 36),
        X("aten::empty_strided", 13, 1),  # a buffer allocation: no kernel, stays 'other'
        A("graph_0_cpp_fused_native_layer_norm_0", 14, 4),
        X("aten::addmm", 18, 8),
        A("graph_0_cpp_fused_gelu_view_1", 27, 5),
        X("aten::addmm", 33, 12),
        A("lmprof:backward", 50, 40),
        X("autograd::engine::evaluate_function: CompiledFunctionBackward", 52, 30),
        A(BWD_CALL, 54, 26),
        A("graph_0_cpp_fused_sum_0", 55, 4),
        X("aten::mm", 60, 15),
    ]


def write(tmp_path, events):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return load_trace(path)


def test_kernels_of_compiled_graphs_go_to_their_blocks_by_hand(tmp_path):
    att = attribute(write(tmp_path, compiled_step()), clock="cpu", compiled=GRAPHS)
    got = {(p.phase, p.name): p.us for p in att.parts}
    # The graph call's time before each kernel is that kernel's (the wrapper allocating its buffers and
    # calling it): forward 12->14 (the allocation 13-14 in it) to the layer norm, 26->27 to the fused
    # gelu kernel, 32->33 to the fc matmul; backward 54->55 and 59->60. The fused kernels' 5+1 us
    # (forward) and 4+1 us (backward) are split 1:4 and 1:3 among their blocks.
    assert got == pytest.approx({
        ("forward", "ln_1"): 4 + 2,
        ("forward", "attn.qkv"): 8,
        ("forward", "mlp.fc"): 12 + 1 + 0.2 * 6,
        ("forward", "mlp.act"): 0.8 * 6,
        # the graph call's own time after its last kernel (45->48)
        ("forward", "compiled_call"): 48 - 45,
        ("forward", "other"): 40 - 36,  # the forward scope outside the call
        ("backward", "mlp.act"): 0.25 * 5,
        ("backward", "mlp.proj"): 0.75 * 5,
        ("backward", "mlp.fc"): 15 + 1,
        # the CompiledFunctionBackward node (30) around the call (26); the call's time after its last kernel (75->80)
        ("backward", "compiled_call"): (30 - 26) + (80 - 75),
        ("backward", "autograd_engine"): 40 - 30,
        ("step", "other"): 100 - 80,
    })
    assert not any("+" in p.name for p in att.parts)
    assert att.total_us() == pytest.approx(100)
    assert att.compiled
    assert att.fused_per_step == [pytest.approx({("mlp.fc", "forward"): 1.2, ("mlp.act", "forward"): 4.8,
                                                 ("mlp.act", "backward"): 1.25, ("mlp.proj", "backward"): 3.75})]
    fused = {(f.kernel, f.phase): f for f in att.fused_kernels}
    assert set(fused) == {("cpp_fused_gelu_view_1", "forward"), ("cpp_fused_sum_0", "backward")}
    gelu = fused[("cpp_fused_gelu_view_1", "forward")]
    assert (gelu.label, gelu.shares, gelu.basis, gelu.us, gelu.calls) == ("mlp.fc+mlp.act", (0.2, 0.8), "bytes", 6, 1)
    assert fused[("cpp_fused_sum_0", "backward")].us == 5
    # Kernels issued per step: each kernel counts for each block it is split among.
    assert att.issued == {("ln_1", "forward"): 1, ("attn.qkv", "forward"): 1, ("mlp.fc", "forward"): 2,
                          ("mlp.act", "forward"): 1, ("mlp.act", "backward"): 1, ("mlp.proj", "backward"): 1,
                          ("mlp.fc", "backward"): 1,
                          ("compiled_call", "forward"): 1}  # the allocation the graph call makes itself


def test_eager_blocks_count_the_operators_they_call_directly(tmp_path):
    """Two steps; attn.qkv calls aten::linear (with aten::addmm inside: not counted) and aten::view."""
    events = []
    for base in (0, 100):
        events += [A(f"ProfilerStep#{base}", base, 100), A("lmprof:forward", base + 10, 50),
                   A("lmprof:attn.qkv", base + 12, 30), X("aten::linear", base + 13, 10),
                   X("aten::addmm", base + 14, 8), X("aten::view", base + 25, 2), X("aten::add", base + 45, 2)]
    att = attribute(write(tmp_path, events), clock="cpu")
    assert att.issued == {("attn.qkv", "forward"): 2, ("other", "forward"): 1}
    # Without the record the same trace is all 'other', as before.
    plain = {(p.phase, p.name) for p in attribute(write(tmp_path, compiled_step()), clock="cpu").parts}
    assert plain == {("forward", "other"), ("backward", "other"), ("backward", "autograd_engine"), ("step", "other")}


def test_a_call_whose_kernels_match_no_record_stays_unnamed(tmp_path):
    events = [e if e["name"] != "graph_0_cpp_fused_gelu_view_1" else {**e, "name": "graph_0_cpp_fused_other_9"}
              for e in compiled_step()]
    labels = set(kernel_blocks(write(tmp_path, events), GRAPHS).values())
    assert labels == {"mlp.act+mlp.proj", "mlp.fc"}  # only the backward graph matched


def test_extern_calls_missing_from_the_trace_leave_the_rest_unnamed(tmp_path):
    events = [e for e in compiled_step() if not (e["name"] == "aten::addmm" and e["ts"] == 33)]
    table = write(tmp_path, events)
    labels = kernel_blocks(table, GRAPHS)
    assert sorted(labels.values()) == sorted(["ln_1", "attn.qkv", "mlp.fc+mlp.act", "mlp.act+mlp.proj", "mlp.fc"])


def test_a_record_without_shares_splits_evenly_and_zero_shares_take_nothing(tmp_path):
    graphs = [{"kernels": [dict(k, shares=[0.0, 1.0]) if k["name"] == "cpp_fused_gelu_view_1" else
                           {kk: v for kk, v in k.items() if kk not in ("shares", "basis")}
                           for k in GRAPHS[0]["kernels"]]}, {"kernels": [
        {kk: v for kk, v in k.items() if kk not in ("shares", "basis")} for k in GRAPHS[1]["kernels"]]}]
    att = attribute(write(tmp_path, compiled_step()), clock="cpu", compiled=graphs)
    got = {(p.phase, p.name): p.us for p in att.parts}
    # each kernel with the graph call's 1 us before it (its launch): fc's share of the gelu kernel is 0
    assert got[("forward", "mlp.fc")] == 12 + 1 and got[("forward", "mlp.act")] == 5 + 1  # (not fused)
    assert got[("backward", "mlp.act")] == 2.5 and got[("backward", "mlp.proj")] == 2.5  # even: 4 + 1 us in halves
    assert [(f.kernel, f.basis) for f in att.fused_kernels] == [("cpp_fused_sum_0", "even")]


def test_extern_op_names():
    assert extern_op_name("mm") == "aten::mm"
    assert extern_op_name("aten._scaled_dot_product_flash_attention_for_cpu.default") == \
        "aten::_scaled_dot_product_flash_attention_for_cpu"


def test_source_lines_map_to_the_scope_around_them():
    from lmprof.measure.compiled_kernels import block_of_stack, graph_kernels
    from lmprof.workloads import gpt

    src = inspect.getsourcefile(gpt)
    lines = open(src).read().splitlines()
    fc = 1 + next(i for i, ln in enumerate(lines) if "x = self.c_fc(x)" in ln)
    act = 1 + next(i for i, ln in enumerate(lines) if "x = self.gelu(x)" in ln)
    layer_call = 1 + next(i for i, ln in enumerate(lines) if "h = self.mlp(h)" in ln)
    stack = (f'  File "{src}", line {layer_call}, in forward\n    h = self.mlp(h)\n'
             f'  File "{src}", line {fc}, in forward\n    x = self.c_fc(x)\n'
             '  File "/torch/nn/modules/linear.py", line 134, in forward\n')
    assert block_of_stack(stack, src) == "mlp.fc"
    assert block_of_stack(f'  File "{src}", line {layer_call}, in forward\n', src) is None  # outside any scope
    act_stack = f'  File "{src}", line {act}, in forward\n'
    kernels = graph_kernels({"cpp_fused_gelu_1:3": [act_stack, stack], "extern_kernels.addmm:2": [stack]}, src)
    assert [(k["name"], k["extern"], k["blocks"], k["basis"]) for k in kernels] == [
        ("addmm", True, ["mlp.fc"], "even"), ("cpp_fused_gelu_1", False, ["mlp.fc", "mlp.act"], "even")]
    assert kernels[1]["shares"] == [0.5, 0.5]  # no nodes to weigh: even


def test_nodes_weigh_their_flops_and_output_bytes_by_hand():
    """node_info on a graph traced with fake tensors: an mm's FLOPs are 2*m*k*n, a pointwise op's
    bytes its output's, a view's nothing; shares follow FLOPs when there are any, else bytes."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from lmprof.measure.compiled_kernels import NodeInfo, _weighed, graph_kernels, node_info

    def f(a, b):
        return (a @ b).relu().view(-1)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8), torch.randn(8, 16))
    info = {str(n.target): node_info(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert info["aten.mm.default"].flops == 2 * 4 * 8 * 16
    assert info["aten.mm.default"].bytes == 4 * 16 * 4
    assert (info["aten.relu.default"].flops, info["aten.relu.default"].bytes) == (0, 4 * 16 * 4)
    assert info["aten.view.default"].bytes == 0  # a view moves nothing

    src = inspect.getsourcefile(__import__("lmprof.workloads.gpt", fromlist=["x"]))
    lines = open(src).read().splitlines()
    fc = f'  File "{src}", line {1 + next(i for i, ln in enumerate(lines) if "x = self.c_fc(x)" in ln)}, in forward\n'
    act = f'  File "{src}", line {1 + next(i for i, ln in enumerate(lines) if "x = self.gelu(x)" in ln)}, in forward\n'
    by_bytes = _weighed(["mlp.fc", "mlp.act"], [NodeInfo(fc, 0, 100), NodeInfo(act, 0, 300), NodeInfo("", 0, 999)], src)
    assert (by_bytes["basis"], by_bytes["shares"]) == ("bytes", [0.25, 0.75])  # the unscoped node weighs nothing
    by_flops = _weighed(["mlp.fc", "mlp.act"], [NodeInfo(fc, 30, 100), NodeInfo(act, 10, 300)], src)
    assert (by_flops["basis"], by_flops["shares"]) == ("flops", [0.75, 0.25])

    # An op run by an extern call that a generated kernel also lists among its origins (inductor's
    # cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_... on the CPU): its FLOPs
    # count once, in the call; the generated kernel is weighed by the bytes of what it writes.
    fc_mm = NodeInfo(fc, 64, 100, "mm_1")
    kernels = graph_kernels({"extern_kernels.mm:0": [fc], "cpp_fused_mm_gelu_1:1": [fc, act]}, src,
                            nodes={"extern_kernels.mm:0": [fc_mm], "cpp_fused_mm_gelu_1:1": [fc_mm, NodeInfo(act, 0, 300, "gelu")]})
    call, fused = kernels
    assert (call["extern"], call["flops"], call["basis"]) == (True, [64], "flops")
    assert (fused["extern"], fused["flops"], fused["basis"], fused["shares"]) == (False, [0.0, 0.0], "bytes", [0.25, 0.75])

def test_device_clock_splits_a_fused_kernels_device_time(tmp_path):
    """GPU clock: the device kernel launched from inside a fused extern call is split 3:1."""
    graphs = [{"kernels": [k if not (k["extern"] and k["blocks"] == ["mlp.fc"]) else
                           {**k, "blocks": ["mlp.fc", "mlp.act"], "shares": [0.75, 0.25], "basis": "flops"}
                           for k in GRAPHS[0]["kernels"]]}, GRAPHS[1]]
    events = compiled_step() + [
        {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 34, "dur": 2, "pid": 1, "tid": 1,
         "args": {"correlation": 1}},
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 40, "dur": 40, "pid": 0, "tid": 7,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
    ]
    att = attribute(write(tmp_path, events), compiled=graphs)
    assert att.clock == "device"
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert got == pytest.approx({("forward", "mlp.fc"): 30, ("forward", "mlp.act"): 10, ("step", "idle"): 60})
    assert att.fused_per_step == [pytest.approx({("mlp.fc", "forward"): 30, ("mlp.act", "forward"): 10})]
    assert [(f.kernel, f.us, f.calls) for f in att.fused_kernels] == [("addmm", 40, 1)]


@pytest.mark.parametrize("extern", [False, True])  # False: as compile time recorded it before the fix
def test_a_fallback_op_runs_as_an_aten_op_under_the_graph_call(tmp_path, extern):
    """Inductor calls ops it cannot lower (the CPU's flash attention) as torch.ops.aten.<op>.default;
    in the trace they are aten ops under the graph call, matched in order like extern matmuls."""
    from lmprof.measure.compiled_kernels import _base_name

    sdpa = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"
    assert _base_name(sdpa + ":4") == (sdpa, True)
    graphs = [{"kernels": [{"name": "cpp_fused_native_layer_norm_0", "extern": False, "blocks": ["ln_1"]},
                           {"name": "addmm", "extern": True, "blocks": ["attn.qkv"]},
                           {"name": sdpa, "extern": extern, "blocks": ["attn.sdpa"]},
                           {"name": "addmm", "extern": True, "blocks": ["attn.proj"]}]}]
    events = [A("ProfilerStep#1", 0, 100), A("lmprof:forward", 10, 80), A(CALL, 12, 70),
              A("graph_0_cpp_fused_native_layer_norm_0", 14, 4), X("aten::addmm", 20, 10),
              X("aten::_scaled_dot_product_flash_attention_for_cpu", 32, 30), X("aten::addmm", 64, 10)]
    got = {(p.phase, p.name): p.us for p in attribute(write(tmp_path, events), clock="cpu", compiled=graphs).parts}
    # each op with the graph call's 2 us before it (12->14, 18->20, 30->32, 62->64); 74->82 stays the call's
    assert got == pytest.approx({("forward", "ln_1"): 4 + 2, ("forward", "attn.qkv"): 10 + 2,
                                 ("forward", "attn.sdpa"): 30 + 2, ("forward", "attn.proj"): 10 + 2,
                                 ("forward", "compiled_call"): 82 - 74,
                                 ("forward", "other"): 80 - 70, ("step", "other"): 100 - 80})
    assert extern_op_name(sdpa) == "aten::_scaled_dot_product_flash_attention_for_cpu"


def test_a_recording_starts_from_an_empty_provenance_record():
    """inductor clears its kernel provenance around a forward compile but not around the backward one
    (compiled at the first backward): a second compiled run in one process saw the first run's
    backward kernels too (36 for 18) and lost its blocks. The recorder starts empty and puts back what
    was there."""
    from torch._inductor import debug as inductor_debug

    from lmprof.measure.compiled_kernels import KernelRecorder

    inductor_debug._inductor_kernel_stack_trace["cpp_fused_stale_0"] = ["an earlier run's kernel"]
    inductor_debug._inductor_triton_kernel_to_post_grad_node_info["cpp_fused_stale_0"] = ["mm_9"]
    try:
        with KernelRecorder():
            assert inductor_debug._inductor_kernel_stack_trace == {}
            assert inductor_debug._inductor_triton_kernel_to_post_grad_node_info == {}
        assert "cpp_fused_stale_0" in inductor_debug._inductor_kernel_stack_trace
    finally:
        inductor_debug._inductor_kernel_stack_trace.pop("cpp_fused_stale_0", None)
        inductor_debug._inductor_triton_kernel_to_post_grad_node_info.pop("cpp_fused_stale_0", None)
