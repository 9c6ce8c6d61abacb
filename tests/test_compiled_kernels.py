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
# then the fc matmul) and a backward graph (one matmul).
GRAPHS = [
    {"kernels": [{"name": "cpp_fused_native_layer_norm_0", "extern": False, "blocks": ["ln_1"]},
                 {"name": "addmm", "extern": True, "blocks": ["attn.qkv"]},
                 {"name": "cpp_fused_gelu_view_1", "extern": False, "blocks": ["mlp.fc", "mlp.act"]},
                 {"name": "addmm", "extern": True, "blocks": ["mlp.fc"]}]},
    {"kernels": [{"name": "cpp_fused_sum_0", "extern": False, "blocks": ["mlp.proj"]},
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
        A("graph_0_cpp_fused_sum_0", 55, 3),
        X("aten::mm", 60, 15),
    ]


def write(tmp_path, events):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return load_trace(path)


def test_kernels_of_compiled_graphs_go_to_their_blocks_by_hand(tmp_path):
    att = attribute(write(tmp_path, compiled_step()), clock="cpu", compiled=GRAPHS)
    got = {(p.phase, p.name): p.us for p in att.parts}
    assert got == {
        ("forward", "ln_1"): 4,
        ("forward", "attn.qkv"): 8,
        ("forward", "mlp.fc+mlp.act"): 5,
        ("forward", "mlp.fc"): 12,
        ("forward", "other"): 40 - 29,  # the call's own time, the allocation, the scope outside the call
        ("backward", "mlp.proj"): 3,
        ("backward", "mlp.fc"): 15,
        ("backward", "other"): 40 - 18,
        ("step", "other"): 100 - 80,
    }
    assert att.total_us() == pytest.approx(100)
    # Without the record the same trace is all 'other', as before.
    plain = {(p.phase, p.name) for p in attribute(write(tmp_path, compiled_step()), clock="cpu").parts}
    assert plain == {("forward", "other"), ("backward", "other"), ("step", "other")}


def test_a_call_whose_kernels_match_no_record_stays_unnamed(tmp_path):
    events = [e if e["name"] != "graph_0_cpp_fused_gelu_view_1" else {**e, "name": "graph_0_cpp_fused_other_9"}
              for e in compiled_step()]
    labels = set(kernel_blocks(write(tmp_path, events), GRAPHS).values())
    assert labels == {"mlp.proj", "mlp.fc"}  # only the backward graph matched


def test_extern_calls_missing_from_the_trace_leave_the_rest_unnamed(tmp_path):
    events = [e for e in compiled_step() if not (e["name"] == "aten::addmm" and e["ts"] == 33)]
    table = write(tmp_path, events)
    labels = kernel_blocks(table, GRAPHS)
    assert sorted(labels.values()) == sorted(["ln_1", "attn.qkv", "mlp.fc+mlp.act", "mlp.proj", "mlp.fc"])


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
    assert kernels == [{"name": "addmm", "extern": True, "blocks": ["mlp.fc"]},
                       {"name": "cpp_fused_gelu_1", "extern": False, "blocks": ["mlp.fc", "mlp.act"]}]
