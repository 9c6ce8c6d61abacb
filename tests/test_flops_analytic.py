"""Analytic FLOPs and bytes against numbers worked out by hand (see the comments for the arithmetic)."""
from __future__ import annotations

import pytest

from lmprof.estimate.flops import (
    FlopConventions,
    block_costs,
    dtype_bytes,
    model_flops_per_step,
    model_flops_per_token,
    normalize_dtype,
    phase_costs,
    totals,
)
from lmprof.errors import ConfigError
from lmprof.estimate.shape import ModelShape

# Shape A: GPT-2 style, d=128, 4 layers, 4 heads, V=65 (the tiny preset), T=64.
A = ModelShape(n_layer=4, n_head=4, n_embd=128, vocab_size=65, block_size=256)
# Shape B: Llama style: GQA (8 query heads, 2 KV heads, head_dim 32), SwiGLU d_ff=512, RMSNorm, RoPE,
# no biases, untied head, V=1000, T=32.
B = ModelShape(
    n_layer=2, n_head=8, n_embd=256, vocab_size=1000, block_size=128, n_kv_head=2, d_ff=512,
    mlp="swiglu", norm="rmsnorm", pos="rope", bias=False, tied=False,
)


def per_layer(costs, name):
    (b,) = [c for c in costs if c.name == name]
    return b.matmul_flops / b.count


def test_itemization_gpt2_shape_per_sequence():
    c = block_costs(A, batch=1, seq_len=64, phase="forward", dtype="fp32")
    # d=128, T=64, V=65: d^2 = 16,384
    assert per_layer(c, "attn.qkv") == 6_291_456  # 2*T*3d^2 = 2*64*3*16384
    assert per_layer(c, "attn.scores") == 1_048_576  # 2*T^2*d = 2*4096*128
    assert per_layer(c, "attn.av") == 1_048_576  # 2*T^2*d
    assert per_layer(c, "attn.proj") == 2_097_152  # 2*T*d^2 = 2*64*16384
    assert per_layer(c, "mlp.fc") + per_layer(c, "mlp.proj") == 16_777_216  # 16*T*d^2 = 16*64*16384
    assert per_layer(c, "mlp.fc") == per_layer(c, "mlp.proj") == 8_388_608
    assert per_layer(c, "lm_head") == 1_064_960  # 2*T*d*V = 2*64*128*65
    counts = {b.name: b.count for b in c}
    assert counts["attn.qkv"] == 4 and counts["residual"] == 8 and counts["lm_head"] == 1
    # Norms, softmax, activation and residual adds have no matmul FLOPs.
    for name in ("embedding", "ln_1", "attn.softmax", "residual", "ln_2", "mlp.act", "ln_f", "loss"):
        assert per_layer(c, name) == 0
    # Whole forward = T * (2 * matmul params + 4*L*d*T):
    # matmul params 12*L*d^2 + d*V = 786,432 + 8,320 = 794,752; 2x = 1,589,504; 4*4*128*64 = 131,072
    assert totals(c)["matmul_flops"] == 64 * (1_589_504 + 131_072) == 110_116_864


def test_itemization_gqa_swiglu_shape():
    c = block_costs(B, batch=1, seq_len=32, phase="forward", dtype="bf16")
    # d=256, kv_dim = 2 heads * 32 = 64: 2*T*d*(d + 2*kv) = 2*32*256*384
    assert per_layer(c, "attn.qkv") == 6_291_456
    assert per_layer(c, "attn.scores") == per_layer(c, "attn.av") == 524_288  # 2*32^2*256
    assert per_layer(c, "attn.proj") == 4_194_304  # 2*32*256^2
    assert per_layer(c, "mlp.fc") == 16_777_216  # gate + up: 2*T*d*2f = 2*32*256*1024
    assert per_layer(c, "mlp.proj") == 8_388_608  # down: 2*T*f*d = 2*32*512*256
    assert per_layer(c, "lm_head") == 16_384_000  # 2*T*d*V = 2*32*256*1000
    # RMSNorm: 4 FLOP/element; RoPE adds 3 FLOP per element of q and k in attn.qkv (no biases here)
    (ln1,) = [b for b in c if b.name == "ln_1"]
    assert ln1.other_flops / ln1.count == 4 * 32 * 256
    (qkv,) = [b for b in c if b.name == "attn.qkv"]
    assert qkv.other_flops / qkv.count == 3 * 32 * (256 + 64)


def test_batch_scales_linearly_and_backward_is_twice_forward():
    one = {b.name: b for b in block_costs(A, batch=1, seq_len=64, phase="forward")}
    three = {b.name: b for b in block_costs(A, batch=3, seq_len=64, phase="forward")}
    bwd = {b.name: b for b in block_costs(A, batch=1, seq_len=64, phase="backward")}
    for name, b in one.items():
        assert three[name].matmul_flops == 3 * b.matmul_flops
        assert bwd[name].matmul_flops == 2 * b.matmul_flops
        assert bwd[name].other_flops == 2 * b.other_flops
        assert bwd[name].bytes == 2 * b.bytes
        assert bwd[name].phase == "backward"


def test_causal_convention_counts_attended_pairs_only():
    full = block_costs(A, batch=1, seq_len=64, phase="forward")
    causal = block_costs(A, batch=1, seq_len=64, phase="forward", conventions=FlopConventions(causal_attention=True))
    # 64 * 65 / 2 = 2,080 attended pairs per head: 2 * 2080 * 128 (summed over heads) = 532,480
    assert per_layer(causal, "attn.scores") == 532_480
    assert per_layer(full, "attn.scores") == 1_048_576
    assert per_layer(causal, "attn.qkv") == per_layer(full, "attn.qkv")


def test_macs_convention():
    macs = block_costs(A, batch=1, seq_len=64, phase="forward", conventions=FlopConventions(flops_per_mac=1))
    assert per_layer(macs, "attn.qkv") == 6_291_456 // 2


def test_decode_step_reads_weights_and_kv_cache():
    c = block_costs(A, batch=1, seq_len=100, phase="decode", dtype="fp32")
    assert per_layer(c, "attn.qkv") == 98_304  # 2 * 3d^2, one token
    assert per_layer(c, "attn.scores") == 25_600  # 2 * S * d = 2 * 100 * 128
    assert per_layer(c, "attn.av") == 25_600
    assert per_layer(c, "lm_head") == 16_640  # 2 * d * V
    (scores,) = [b for b in c if b.name == "attn.scores"]
    (av,) = [b for b in c if b.name == "attn.av"]
    # K cache: S * kv_dim * 4 bytes = 100 * 128 * 4 = 51,200 per layer; same for V in attn.av
    assert scores.kv_bytes / scores.count == 51_200
    assert av.kv_bytes / av.count == 51_200
    (qkv,) = [b for b in c if b.name == "attn.qkv"]
    # weights 128*384 + 384 bias = 49,536 params * 4 B
    assert qkv.weight_bytes / qkv.count == 198_144
    assert all(b.name != "loss" for b in c)


def test_bytes_of_qkv_forward_bf16():
    c = block_costs(A, batch=1, seq_len=64, phase="forward", dtype="bf16")
    (qkv,) = [b for b in c if b.name == "attn.qkv"]
    # read x: 64*128*2 = 16,384; weights (128*384 + 384)*2 = 99,072; write 64*384*2 = 49,152
    assert qkv.bytes / qkv.count == 16_384 + 99_072 + 49_152
    assert qkv.intensity == pytest.approx(qkv.flops / qkv.bytes)


def test_prefill_logits_last_or_all():
    last = block_costs(A, batch=2, seq_len=64, phase="prefill")
    everything = block_costs(A, batch=2, seq_len=64, phase="prefill", conventions=FlopConventions(prefill_logits="all"))
    assert per_layer(last, "lm_head") == 2 * 2 * 128 * 65  # B * 2dV
    assert per_layer(everything, "lm_head") == 2 * 2 * 64 * 128 * 65


def test_sdpa_block_fuses_scores_and_av():
    math = block_costs(A, batch=1, seq_len=64, phase="forward")
    fused = block_costs(A, batch=1, seq_len=64, phase="forward", attention="sdpa")
    assert per_layer(fused, "attn.sdpa") == per_layer(math, "attn.scores") + per_layer(math, "attn.av")
    (sdpa,) = [b for b in fused if b.name == "attn.sdpa"]
    unfused = sum(b.bytes for b in math if b.name in ("attn.scores", "attn.softmax", "attn.av"))
    # fused: read q, K, V and write o once, bf16, per layer: 4 * 64*128*2 = 65,536; no T x S matrix
    assert sdpa.bytes / sdpa.count == 65_536
    assert sdpa.bytes < unfused
    assert "attn.scores" not in {b.name for b in fused}


def test_model_flops_per_token_and_step():
    n = A.n_params_non_embedding()
    # nanoGPT / PaLM: 6N + 12*L*H*Q*T, H*Q = d = 128, L = 4, T = 64 -> 12*4*128*64 = 393,216
    assert model_flops_per_token(A, 64) == 6 * n + 393_216
    assert model_flops_per_token(A, 64, "forward") == 2 * n + 131_072
    assert model_flops_per_step(A, batch=8, seq_len=64, mode="train") == 8 * 64 * (6 * n + 393_216)
    # prefill keeps only the last position's logits: minus 2*d*V for the other 63 positions, per sequence
    assert model_flops_per_step(A, batch=2, seq_len=64, mode="prefill") == 2 * 64 * (2 * n + 131_072) - 2 * 128 * 65 * 2 * 63
    # decode 3 steps after a 10-token prompt: contexts 11, 12, 13 -> sum 36
    assert model_flops_per_step(A, batch=1, seq_len=10, mode="decode", decode_tokens=3) == 3 * 2 * n + 4 * 4 * 128 * 36
    # The analytic block sum agrees with 6N + 12LdT to within the bias and norm parameters.
    blocks = totals(phase_costs(A, batch=1, seq_len=64, phase="train"))["matmul_flops"]
    assert blocks == pytest.approx(model_flops_per_step(A, batch=1, seq_len=64, mode="train"), rel=0.01)


def test_decode_phase_sums_steps():
    steps = phase_costs(A, batch=1, seq_len=10, phase="decode", decode_tokens=3)
    one = {k: block_costs(A, batch=1, seq_len=s, phase="decode") for k, s in enumerate((11, 12, 13))}
    (scores,) = [b for b in steps if b.name == "attn.scores"]
    assert scores.matmul_flops == sum(per_layer(one[k], "attn.scores") * 4 for k in one)


def test_conventions_are_described():
    text = FlopConventions().describe()
    for phrase in ("multiply-add = 2 FLOPs", "causal mask not subtracted", "tied lm_head counted once",
                   "backward = 2 x forward for matmuls", "FLOP/element"):
        assert phrase in text
    assert "0 FLOPs" in FlopConventions(elementwise=False).describe()
    zero = block_costs(A, batch=1, seq_len=8, phase="forward", conventions=FlopConventions(elementwise=False))
    assert all(b.other_flops == 0 for b in zero)


def test_dtypes():
    assert normalize_dtype("bfloat16") == "bf16"
    assert normalize_dtype("torch.float16") == "fp16"
    assert dtype_bytes("fp32") == 4 and dtype_bytes("bf16") == 2 and dtype_bytes("fp8") == 1
    with pytest.raises(ConfigError):
        normalize_dtype("int3")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch=-1, seq_len=8, phase="forward"),
        dict(batch=1, seq_len=0, phase="forward"),
        dict(batch=1, seq_len=8, phase="sideways"),
        dict(batch=1, seq_len=8, phase="prefill", context=4),
    ],
)
def test_bad_input(kwargs):
    with pytest.raises(ConfigError):
        block_costs(A, **kwargs)
