"""The analytic memory breakdown against numbers worked out by hand (arithmetic written out)."""
from __future__ import annotations

import pytest

from lmprof.estimate.memory import (
    estimate_memory,
    format_bytes,
    kv_cache_bytes,
    largest_fitting_batch,
    memory_metrics,
    memory_table,
)
from lmprof.errors import ConfigError
from lmprof.workloads.gpt import PRESETS
from lmprof.estimate.shape import ModelShape

TINY = PRESETS["tiny"].shape()  # L=4, a=4, h=128, V=65, block 256
GPT2 = PRESETS["gpt2"].shape()  # L=12, a=12, h=768, V=50257, block 1024


def test_tiny_fp32_math_by_hand() -> None:
    s, b, h, a, f, V, L = 64, 4, 128, 4, 512, 65, 4
    sbh = s * b * h  # 32768 elements
    # hold_logits: the step keeps `logits, loss = model(x, y)` alive until it returns.
    est = estimate_memory(TINY, batch=b, seq_len=s, dtype="fp32", attention="math", device_kind="cpu",
                          hold_logits=True)

    # 834,432 parameters, 4 B each; grads the same; AdamW: two fp32 moments + one 4 B step per tensor.
    assert est.n_params == 834_432
    assert est.params == 834_432 * 4 == 3_337_728
    assert est.grads == 3_337_728
    n_tensors = 2 + L * 12 + 2  # wte+wpe, 12 per block (2 norms, 4 linears, each weight+bias), ln_f
    assert est.optimizer_state == 2 * 3_337_728 + n_tensors * 4 == 6_675_664
    assert est.buffers == L * 256 * 256  # bool causal mask per layer

    per_layer = (
        sbh * 4 + 2 * s * b * 4  # ln_1: input (fp32) + mean/rstd
        + sbh * 4  # attn.qkv: input
        + 2 * sbh * 4 + s * s  # attn.scores: q and k, the bool causal mask
        + a * s * s * b * 4  # attn.softmax: output (also what the AV matmul saves: no dropout)
        + sbh * 4  # attn.av: v
        + sbh * 4  # attn.proj: input
        + sbh * 4 + 2 * s * b * 4  # ln_2
        + sbh * 4  # mlp.fc: input
        + s * b * f * 4  # mlp.act: GELU input
        + s * b * f * 4  # mlp.proj: input
    )
    assert per_layer == 2_367_488
    assert est.activations_per_layer == per_layer
    once = s * 8 + (sbh * 4 + 2 * s * b * 4) + sbh * 4 + s * b * V * 4 + 4  # positions, ln_f, lm_head, log-softmax, loss
    assert est.activations == L * per_layer + once == 9_801_220
    assert est.logits == s * b * V * 4 == 66_560

    # Peak: the first layer of backward. Static state + every layer's activations + positions +
    # the held logits + lm_head/ln_f grads + one MLP's backward temporaries.
    static = 3_337_728 + L * 256 * 256 + 6_675_664
    g_head = (V * h + 2 * h) * 4
    bwd_temp = sbh * 4 + s * b * f * 4 + h * f * 4
    assert est.peak_at == "backward (layers)"
    assert est.peak == static + L * per_layer + s * 8 + 66_560 + g_head + bwd_temp == 20_764_368
    assert sum(est.at_peak.values()) == est.peak
    assert est.at_peak["grads"] == g_head
    # lmprof's own step keeps only the loss: the logits die with the forward pass.
    dropped = estimate_memory(TINY, batch=b, seq_len=s, dtype="fp32", attention="math", device_kind="cpu")
    assert dropped.peak == est.peak - 66_560
    assert dropped.moments["end of forward"] == est.moments["end of forward"]  # alive while the loss is computed


def test_gpt2_bf16_autocast_sdpa_cuda_by_hand() -> None:
    s, b, h, a, f, V, L = 1024, 8, 768, 12, 3072, 50257, 12
    sbh = s * b * h
    est = estimate_memory(GPT2, batch=b, seq_len=s, dtype="bf16", attention="sdpa", device_kind="cuda")
    assert est.n_params == 124_439_808
    assert est.params == est.grads == 124_439_808 * 4  # autocast keeps fp32 parameters
    assert est.master_weights == 0  # ... which are their own master copy

    layer_matmul_weights = h * 3 * h + h * h + 2 * h * f
    per_layer = (
        sbh * 4 + 2 * s * b * 4  # ln_1: fp32 residual stream + stats
        + sbh * 2  # attn.qkv: bf16 copy of the ln_1 output
        + 3 * sbh * 2 + sbh * 2 + a * s * b * 4  # sdpa: q, k, v, output, fp32 log-sum-exp; no scores
        + sbh * 4 + 2 * s * b * 4  # ln_2
        + sbh * 2 + s * b * f * 2 + s * b * f * 2  # mlp.fc input, GELU input, mlp.proj input (bf16)
        + 2 * layer_matmul_weights  # autocast's bf16 weight copies, saved by the linears
    )
    assert est.activations_per_layer == per_layer
    once = s * 8 + (sbh * 4 + 2 * s * b * 4) + sbh * 2 + 2 * V * h + s * b * V * 4 + 4
    assert est.activations == L * per_layer + once
    assert est.logits == s * b * V * 2  # the lm_head's bf16 output

    # Loss-gradient moment: nll_loss's and log_softmax's gradients, both fp32 (b, s, V); the logits
    # themselves are gone (the step keeps only the loss).
    static = est.params + est.buffers + est.optimizer_state
    assert est.moments["backward (loss gradient)"] == static + est.activations + 2 * s * b * V * 4
    # Cross-entropy's fp32 copy of the logits and the bf16 bias copies are alive as forward ends.
    biases = L * (3 * h + h + f + h)
    assert est.moments["end of forward"] == static + est.activations + est.logits + 2 * biases + s * b * V * 4
    assert est.peak == max(est.moments.values())
    assert est.peak_at == "backward (loss gradient)"


def test_paper_formula_in_its_own_regime() -> None:
    """16-bit tensors, dropout on, unfused attention: Korthikanti's sbh(34 + 5as/h) per layer, plus
    what the paper leaves out (layer-norm statistics and the causal mask)."""
    s, b, h, a = 128, 2, 128, 4
    est = estimate_memory(TINY, batch=b, seq_len=s, param_dtype="bf16", attention="math", dropout=0.1,
                          device_kind="cuda")
    paper = s * b * h * (34 + 5 * a * s / h)
    extras = 2 * (2 * s * b * 4) + s * s
    assert est.activations_per_layer == paper + extras
    # Without dropout the masks and the separate dropout output go: 32sbh + 2as^2b.
    est0 = estimate_memory(TINY, batch=b, seq_len=s, param_dtype="bf16", attention="math", device_kind="cuda")
    assert est0.activations_per_layer == s * b * h * (32 + 2 * a * s / h) + extras


def test_sdpa_drops_the_quadratic_term() -> None:
    small = estimate_memory(TINY, batch=2, seq_len=64, attention="sdpa")
    big = estimate_memory(TINY, batch=2, seq_len=128, attention="sdpa")
    math_small = estimate_memory(TINY, batch=2, seq_len=64, attention="math")
    math_big = estimate_memory(TINY, batch=2, seq_len=128, attention="math")
    # Fused attention: per-layer activations scale linearly in s; math adds a*s^2*b.
    assert big.activations_per_layer == 2 * small.activations_per_layer
    assert math_big.activations_per_layer - 2 * math_small.activations_per_layer == 4 * 2 * (128**2 - 2 * 64**2) * 4 + (
        128**2 - 2 * 64**2)


def test_optimizer_regimes() -> None:
    n = TINY.n_params()
    sgd = estimate_memory(TINY, batch=1, seq_len=8, optimizer="sgd")
    assert sgd.optimizer_state == n * 4  # one fp32 momentum buffer, no step counters
    pure = estimate_memory(TINY, batch=1, seq_len=8, param_dtype="bf16")
    # 16-bit params: 2 B params + 2 B grads; optimizer: fp32 master (4) + two fp32 moments (8) + steps.
    assert pure.params == pure.grads == 2 * n
    assert pure.master_weights == 4 * n
    assert pure.optimizer_state == 4 * n + 8 * n + 52 * 4
    plain = estimate_memory(TINY, batch=1, seq_len=8, param_dtype="bf16", master_weights=False)
    assert plain.optimizer_state == 2 * 2 * n + 52 * 4  # moments in bf16, like the params


def test_inference_kv_cache_by_hand() -> None:
    est = estimate_memory(GPT2, batch=4, seq_len=512, mode="infer", new_tokens=128, dtype="bf16")
    # 2 (k, v) x 12 layers x 12 kv heads x 64 head dim x 640 tokens x 4 sequences x 2 B.
    assert est.kv_cache == 2 * 12 * 12 * 64 * 640 * 4 * 2 == 94_371_840
    assert est.kv_cache == kv_cache_bytes(GPT2, 4, 640, 2)
    assert est.grads == est.optimizer_state == est.activations == 0
    assert est.peak == sum(est.at_peak.values())
    gqa = ModelShape(n_layer=2, n_head=8, n_embd=256, vocab_size=100, block_size=64, n_kv_head=2)
    assert kv_cache_bytes(gqa, 1, 64, 2) == 2 * 2 * 2 * 32 * 64 * 1 * 2


def test_largest_fitting_batch_is_the_boundary() -> None:
    def at(b: int):
        return estimate_memory(TINY, batch=b, seq_len=64, device_kind="cpu")

    budget = at(10).peak + 1
    best = largest_fitting_batch(budget, at)
    assert best == 10
    assert at(best + 1).peak > budget
    assert largest_fitting_batch(at(1).peak - 1, at) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch": 0, "seq_len": 8},
        {"batch": 1, "seq_len": 0},
        {"batch": 1, "seq_len": 300},  # beyond block_size 256
        {"batch": 1, "seq_len": 8, "dtype": "fp8"},
        {"batch": 1, "seq_len": 8, "attention": "flash"},
        {"batch": 1, "seq_len": 8, "optimizer": "lion"},
        {"batch": 1, "seq_len": 8, "dropout": 1.5},
        {"batch": 1, "seq_len": 250, "mode": "infer", "new_tokens": 10},
    ],
)
def test_bad_input_is_a_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        estimate_memory(TINY, **kwargs)


def test_metrics_and_table_without_measurement() -> None:
    est = estimate_memory(TINY, batch=4, seq_len=64, device_kind="cpu")
    metrics = memory_metrics(est, None)
    assert metrics["memory.estimated.params"].value == 3_337_728
    assert metrics["memory.estimated.params"].source == "estimated"
    assert metrics["memory.estimated.activations"].value == est.activations  # logits not held
    assert metrics["memory.peak"].value is None and metrics["memory.peak"].note
    assert "memory.kv_cache" not in metrics
    rows = memory_table(est, None)
    assert [r["category"] for r in rows] == ["params", "grads", "optimizer", "activations", "peak"]
    assert all(r["measured_bytes"] is None and r["diff_pct"] is None for r in rows)
    infer = memory_metrics(estimate_memory(TINY, batch=1, seq_len=8, mode="infer"), None)
    assert "memory.kv_cache" in infer and "memory.grads" not in infer


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(80 * 1024**3) == "80.00 GiB"
    assert format_bytes(None) == "n/a"
