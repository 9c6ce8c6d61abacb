"""Measured FLOPs (torch's FlopCounterMode formulas) per block against the analytic counts, within 1%."""
from __future__ import annotations

import pytest
import torch

from lmprof.estimate.flops import block_costs
from lmprof.measure.flops import compare, count_flops, count_gpt_flops, module_block
from lmprof.workloads.gpt import GPT, GPTConfig

MATMUL_BLOCKS = {"attn.qkv", "attn.scores", "attn.av", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"}


@pytest.fixture(scope="module")
def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=65, attention="math")).float()


@pytest.fixture(scope="module")
def train_counts(tiny):
    return count_gpt_flops(tiny, batch=2, seq_len=32, mode="train")


def test_forward_and_backward_per_block_match_analytic(tiny, train_counts):
    shape = tiny.config.shape()
    analytic = [
        *block_costs(shape, batch=2, seq_len=32, phase="forward", dtype="fp32"),
        *block_costs(shape, batch=2, seq_len=32, phase="backward", dtype="fp32"),
    ]
    pairs = compare(analytic, train_counts)
    assert {(c.name, c.phase) for c in pairs} == {(n, p) for n in MATMUL_BLOCKS for p in ("forward", "backward")}
    for c in pairs:
        assert c.ok(0.01), f"{c.name} {c.phase}: analytic {c.analytic:,.0f} vs measured {c.measured:,.0f}"
    # Nothing counted outside the matmul blocks, and scores/av really were told apart.
    assert {name for name, _ in train_counts.by_block} == MATMUL_BLOCKS
    assert train_counts.block("attn.scores") > 0 and train_counts.block("attn.av", "backward") > 0


def test_module_attribution_agrees_with_scopes(train_counts):
    by_module = train_counts.module_blocks()
    for phase in ("forward", "backward"):
        for name in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"):
            assert by_module[(name, phase)] == train_counts.block(name, phase)
        core = train_counts.block("attn.scores", phase) + train_counts.block("attn.av", phase)
        assert by_module[("attn.core", phase)] == core
    # FlopCounterMode's root total is the same as the sum over blocks.
    assert train_counts.by_module[("GPT", "forward")] == train_counts.total("forward")
    assert train_counts.by_module[("GPT", "backward")] == train_counts.total("backward")


def test_uncounted_ops_are_listed(train_counts):
    names = {u.name for u in train_counts.uncounted}
    assert "aten.native_layer_norm" in names and "aten._softmax" in names
    assert not train_counts.compute_uncounted()  # math attention: every matmul has a formula
    assert "uncounted non-matmul ops" in train_counts.summary()


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_inference_phases_match_analytic(tiny, mode):
    measured = count_gpt_flops(tiny, batch=2, seq_len=24, mode=mode)
    analytic = block_costs(tiny.config.shape(), batch=2, seq_len=24, phase=mode, dtype="fp32")
    for c in compare(analytic, measured):
        assert c.ok(0.01), f"{mode} {c.name}: {c.analytic} vs {c.measured}"
    assert measured.total("backward") == 0


def test_sdpa_op_without_formula_is_listed_not_zeroed():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=11, attention="sdpa"))
    counts = count_gpt_flops(model, batch=1, seq_len=8, mode="train")
    compute = counts.compute_uncounted()
    # The CPU build dispatches SDPA to an op FlopCounterMode has no formula for.
    assert any("scaled_dot_product" in u.name for u in compute), [u.name for u in counts.uncounted]
    assert all("attn.sdpa" in u.blocks for u in compute if "scaled_dot_product" in u.name)
    assert "uncounted compute ops" in counts.summary()


def test_unscoped_model_counts_under_unscoped():
    lin = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8)
    counts = count_flops(lambda: lin(x).sum(), backward=True)
    assert counts.block("(unscoped)", "forward") == 2 * 3 * 8 * 4
    # backward: grad of the weight only (x needs no grad)
    assert counts.block("(unscoped)", "backward") == 2 * 3 * 8 * 4


def test_module_block_mapping():
    assert module_block("GPT.transformer.h.0.attn.c_attn") == "attn.qkv"
    assert module_block("transformer.h.11.mlp.c_proj") == "mlp.proj"
    assert module_block("GPT.lm_head") == "lm_head"
    assert module_block("GPT.transformer.h.0.attn") is None
