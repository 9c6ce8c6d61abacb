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


def test_cpu_sdpa_is_counted_with_torchs_attention_formulas():
    """The CPU build runs SDPA as aten._scaled_dot_product_flash_attention_for_cpu, which torch's
    FlopCounterMode has no formula for: lmprof counts it as torch counts the CUDA flash op. Truth: the
    hand formulas (forward: QK^T and PV, 2 matmuls of 2*B*H*T*T*D; backward: torch's flash-backward
    count, 5 of them, the scores recomputed) and plain FlopCounterMode on the math path's matmuls."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmprof.measure.flops import flop_counter

    torch.manual_seed(0)
    B, H, T, D = 1, 2, 8, 16
    model = GPT(GPTConfig(n_layer=1, n_head=H, n_embd=H * D, block_size=16, vocab_size=11, attention="sdpa"))
    counts = count_gpt_flops(model, batch=B, seq_len=T, mode="train")
    assert not counts.compute_uncounted(), [u.name for u in counts.uncounted]
    assert counts.block("attn.sdpa", "forward") == 2 * (2 * B * H * T * T * D)
    assert counts.block("attn.sdpa", "backward") == 5 * (2 * B * H * T * T * D)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    with flop_counter() as fused:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    with FlopCounterMode(display=False) as math:
        (torch.softmax(q @ k.transpose(-1, -2), -1) @ v).sum()
    assert math.get_total_flops() == 2 * (2 * B * H * T * T * D)
    assert fused.get_total_flops() == math.get_total_flops() + counts.block("attn.sdpa", "backward")


def test_a_compute_op_without_formula_is_listed_not_zeroed():
    a, x = torch.randn(4, 8), torch.randn(8)
    counts = count_flops(lambda: torch.mv(a, x))
    assert [u.name for u in counts.compute_uncounted()] == ["aten.mv"]
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


@pytest.mark.parametrize("op,backward", [
    ("_scaled_dot_product_flash_attention_for_cpu", False),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", True),
    ("_scaled_dot_product_attention_math_for_mps", False),  # Apple MPS: its backward is autograd's matmuls
    ("_scaled_dot_product_fused_attention_overrideable", False),
    ("_scaled_dot_product_fused_attention_overrideable_backward", True),
])
def test_sdpa_ops_off_cuda_get_the_hand_formula(op, backward):
    """Each op SDPA runs as off CUDA, with grouped-query shapes (8 query heads on 2 key/value heads):
    forward 2 matmuls of 2*B*Hq*Tq*Tk*D, backward 5, as torch counts the CUDA flash op."""
    from lmprof.measure.flops import formulas

    B, Hq, Hkv, Tq, Tk, D = 2, 8, 2, 5, 7, 16
    q = torch.empty(B, Hq, Tq, D, device="meta")
    k, v = (torch.empty(B, Hkv, Tk, D, device="meta") for _ in range(2))
    formula = formulas()[getattr(torch.ops.aten, op)]
    args = (torch.empty(B, Hq, Tq, D, device="meta"), q, k, v) if backward else (q, k, v)
    one = 2 * B * Hq * Tq * Tk * D
    assert formula(*args, out_val=None) == (5 if backward else 2) * one
