"""A model whose weights are quantized: torch.ao's dynamic int8 quantization, the way to a faster
``generate()`` on a CPU.

Before, the packed weights (torch.ao keeps them in C++ objects, not parameters) made the model read as
departing from its config (66,176 parameters of 426,624 on a 2-layer Llama), so its FLOPs were counted
with FlopCounterMode, which counts no quantized kernel: prefill MFU 0.1% from a count missing every
Linear, against the fp32 peak, exit 0. Now the weights count at their logical shape, model FLOPs are the
config's, MFU is n/a (the matmuls run in int8, whose peak lmprof does not know), and the bytes, MBU and
memory estimate are n/a (the formulas read fp32 weights). Truth: the same model unquantized, whose FLOPs
lmprof's formulas give within 2% of FlopCounterMode over its generate() (non-matmul FLOPs).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.record.catalogue import BYTES_MODEL, FLOPS_MODEL, MBU, MFU, cost_key
from lmprof.record.run import Run
from script_truth import run_with_truth

pytest.importorskip("transformers")

SCRIPT = """
import json, sys, warnings, torch
from transformers import LlamaConfig, LlamaForCausalLM
from torch.utils.flop_counter import FlopCounterMode
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                 attn_implementation="eager")).eval()
x = torch.randint(1, 512, (2, 16))
kw = dict(max_new_tokens=8, min_new_tokens=8, attention_mask=torch.ones_like(x))
if sys.argv[2] == "int8":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that it moves to torchao
        m = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
if sys.argv[2:] == ["int8", "adapter"]:  # a float adapter beside the quantized weights, as QLoRA adds
    m.model.layers[0].self_attn.q_proj = torch.nn.Sequential(m.model.layers[0].self_attn.q_proj, torch.nn.Linear(128, 128))
with torch.no_grad():
    for i in range(5):
        m.generate(x, **kw)
    with FlopCounterMode(display=False) as fc:
        m.generate(x, **kw)
open(sys.argv[1], "w").write(json.dumps(fc.get_total_flops()))
"""


def _generate(tmp_path: Path, cli, *weights: str) -> tuple[Run, int]:
    return run_with_truth(cli, tmp_path, SCRIPT, "-".join(weights), *weights, infer=True)


def _flops(run: Run) -> float:
    return sum(run.metrics[cost_key(p, FLOPS_MODEL)].value for p in ("prefill", "decode"))


def test_int8_weights_keep_the_configs_flops_and_say_what_has_no_peak(tmp_path: Path, cli) -> None:
    fp32, counted = _generate(tmp_path, cli, "fp32")
    assert 1.0 <= _flops(fp32) / counted < 1.02  # the formulas, against FlopCounterMode on the float model
    int8, counted_int8 = _generate(tmp_path, cli, "int8")
    assert counted_int8 < 0.5 * counted  # what FlopCounterMode sees of the quantized model: no Linear
    assert _flops(int8) == _flops(fp32)
    assert int8.metrics[cost_key("prefill", FLOPS_MODEL)].source == "estimated"
    for p in ("prefill", "decode"):
        assert int8.metrics[cost_key(p, MFU)].value is None
        assert "int8" in int8.metrics[cost_key(p, MFU)].note
        assert int8.metrics[cost_key(p, MBU)].value is None and int8.metrics[cost_key(p, BYTES_MODEL)].value is None
    assert all(b.bytes is None for b in int8.blocks)
    notes = " | ".join(int8.notes)
    assert "quantized weights: torch.ao dynamic quantization (qint8), 15 layers" in notes
    assert "no memory estimate: the weights are quantized" in notes
    assert "departs" not in notes and "parameters where the causal LM its config describes" not in notes


def test_quantized_weights_with_an_adapter_get_no_flops_rather_than_a_count_that_misses_them(tmp_path: Path, cli) -> None:
    """The model departs from its config (an adapter), so the formulas do not describe it, and a count
    misses the quantized matmuls: FLOPs and MFU n/a, said why (never the count's 37x too few)."""
    run, _ = _generate(tmp_path, cli, "int8", "adapter")
    for p in ("prefill", "decode"):
        assert run.metrics[cost_key(p, FLOPS_MODEL)].value is None
        assert "counts no quantized kernel" in run.metrics[cost_key(p, FLOPS_MODEL)].note
        assert run.metrics[cost_key(p, MFU)].value is None
    assert any(n.startswith("no FLOP count: FlopCounterMode counts no quantized kernel") for n in run.notes), run.notes
