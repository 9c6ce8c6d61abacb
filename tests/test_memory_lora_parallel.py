"""LoRA/QLoRA and tensor/sequence/pipeline parallel memory figures, each against a hand formula written here.

Shapes: a tiny Llama-style model (grouped-query attention, SwiGLU, RMSNorm, untied), a tiny Hugging
Face GPT-2 (fused ``c_attn``, biases, LayerNorm, tied) and the built-in tiny GPT for Korthikanti
et al.'s activation formulas (arXiv:2205.05198, table 2).
"""
from __future__ import annotations

import json
import math
from typing import Any

import pytest

from lmprof.cli.main import main
from lmprof.errors import ConfigError
from lmprof.estimate.fit import estimate_plan
from lmprof.estimate.memory import MemoryEstimate, estimate_memory
from lmprof.estimate.memory.lora import Lora, nf4_bytes
from lmprof.estimate.memory.parallel import Parallel
from lmprof.estimate.shape import ModelShape
from lmprof.workloads.gpt import preset

# Llama-style: d=64, 4 heads of 16, 2 KV heads (kv_dim 32), d_ff 128, V 128, 4 layers, untied.
D, H, KVH, F, V, L = 64, 4, 2, 128, 128, 4
KV = KVH * (D // H)
LLAMA = ModelShape(n_layer=L, n_head=H, n_kv_head=KVH, n_embd=D, vocab_size=V, block_size=128, d_ff=F,
                   mlp="swiglu", norm="rmsnorm", pos="rope", bias=False, tied=False, family="llama", name="llama-tiny")
# GPT-2: d=64, 4 heads, d_ff 256, V 100, 2 layers, 64 positions, tied.
GD, GV, GL, GP = 64, 100, 2, 64
GPT2 = ModelShape(n_layer=GL, n_head=4, n_embd=GD, vocab_size=GV, block_size=GP, family="gpt2", name="gpt2-tiny")
TINY = preset("tiny").shape()  # built-in GPT: 4 layers, 4 heads, d 128, V 65


def _llama_adapters(r: int, all_linear: bool) -> int:
    """r * (d_in + d_out) per targeted linear: q (d->d), k and v (d->kv_dim), o (d->d); + gate, up, down."""
    attn = r * (D + D) + 2 * r * (D + KV) + r * (D + D)
    mlp = 3 * r * (D + F)
    return L * (attn + (mlp if all_linear else 0))


def _gpt2_adapters(r: int, all_linear: bool) -> int:
    """GPT-2 fuses q, k, v into c_attn (d -> 3d); c_proj d -> d; c_fc d -> 4d, mlp c_proj 4d -> d."""
    attn = r * (GD + 3 * GD) + r * (GD + GD)
    mlp = r * (GD + 4 * GD) + r * (4 * GD + GD)
    return GL * (attn + (mlp if all_linear else 0))


def _llama_params() -> int:
    per_layer = 2 * D + D * D + 2 * D * KV + D * D + 3 * D * F
    return 2 * V * D + L * per_layer + D


# -- LoRA ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("targets", ["attn", "all-linear"])
def test_lora_trainable_params_llama_and_gpt2(targets: str) -> None:
    all_linear = targets == "all-linear"
    for shape, hand in ((LLAMA, _llama_adapters(8, all_linear)), (GPT2, _gpt2_adapters(8, all_linear))):
        est = estimate_memory(shape, batch=2, seq_len=32, attention="sdpa", lora=Lora(8, targets))  # type: ignore[arg-type]
        assert est.trainable_params == hand
        assert est.n_params == shape.n_params()  # the model itself is unchanged
        assert est.device_params == shape.n_params() + hand  # base + adapters stored


def test_lora_grads_and_optimizer_only_for_adapters() -> None:
    r = 4
    a = _llama_adapters(r, all_linear=False)
    tensors = 2 * 4 * L  # A and B on q, k, v, o in every layer
    fp32 = estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", lora=Lora(r))
    assert fp32.params == (_llama_params() + a) * 4
    assert fp32.grads == a * 4
    assert fp32.optimizer_state == 2 * a * 4 + 4 * tensors  # two fp32 moments + one step scalar per tensor
    assert fp32.master_weights == 0
    bf16 = estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", param_dtype="bf16", lora=Lora(r))
    assert bf16.params == (_llama_params() + a) * 2
    assert bf16.grads == a * 2
    assert bf16.master_weights == a * 4
    assert bf16.optimizer_state == 2 * a * 4 + a * 4 + 4 * tensors
    sgd = estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", optimizer="sgd", lora=Lora(r))
    assert sgd.optimizer_state == a * 4


def test_lora_adds_the_rank_wide_intermediates_to_the_activations() -> None:
    s, b, r = 32, 2, 8
    for shape, linears in ((LLAMA, 4), (GPT2, 2)):  # q, k, v, o; GPT-2: c_attn, c_proj
        plain = estimate_memory(shape, batch=b, seq_len=s, attention="sdpa")
        lora = estimate_memory(shape, batch=b, seq_len=s, attention="sdpa", lora=Lora(r))
        assert lora.activations - plain.activations == shape.n_layer * linears * s * b * r * 4
        assert lora.logits == plain.logits


def test_lora_on_experts() -> None:
    """all-linear on an MoE layer: every expert's gate, up and down; the router carries no adapter.
    Each token passes top_k experts, so the rank-wide intermediates are top_k per expert linear."""
    e, k, fe, r, s, b = 4, 2, 96, 4, 16, 2
    moe = ModelShape(n_layer=2, n_head=H, n_kv_head=KVH, n_embd=D, vocab_size=V, block_size=64, mlp="swiglu",
                     norm="rmsnorm", pos="rope", bias=False, tied=False, family="mixtral", n_experts=e, top_k=k,
                     d_ff_expert=fe)
    attn = r * (D + D) + 2 * r * (D + KV) + r * (D + D)
    est = estimate_memory(moe, batch=b, seq_len=s, attention="sdpa", lora=Lora(r, "all-linear"))
    assert est.trainable_params == 2 * (attn + e * 3 * r * (D + fe))
    plain = estimate_memory(moe, batch=b, seq_len=s, attention="sdpa")
    assert est.activations - plain.activations == 2 * (4 + 3 * k) * s * b * r * 4


def _nf4(n: int, double_quant: bool) -> int:
    """Hand: 4 bits per weight; absmax per 64: fp32, or 8-bit plus one fp32 per 256 blocks."""
    blocks = math.ceil(n / 64)
    return math.ceil(n / 2) + (blocks + 4 * math.ceil(blocks / 256) if double_quant else 4 * blocks)


@pytest.mark.parametrize("double_quant", [True, False])
def test_qlora_weight_bytes(double_quant: bool) -> None:
    r = 8
    a = _llama_adapters(r, all_linear=False)
    linears = [D * D, D * KV, D * KV, D * D, D * F, D * F, F * D]  # q, k, v, o, gate, up, down
    quantized = L * sum(_nf4(n, double_quant) for n in linears)
    unquantized = 2 * V * D + L * 2 * D + D  # embedding, lm_head, norms stay in the param dtype
    est = estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", param_dtype="bf16",
                          lora=Lora(r, qlora=True, double_quant=double_quant))
    assert est.params == quantized + unquantized * 2 + a * 2
    assert est.grads == a * 2


def test_nf4_constants_cost_about_0127_bit_with_double_quant() -> None:
    n = 4096 * 4096
    assert (8 * nf4_bytes(n, True) - 4 * n) / n == pytest.approx(8 / 64 + 32 / (64 * 256))
    assert (8 * nf4_bytes(n, False) - 4 * n) / n == pytest.approx(0.5)


# -- tensor / sequence / pipeline parallel -----------------------------------------------------------

def test_tensor_parallel_params_llama() -> None:
    t = 2
    per_layer = 2 * D + (D * D + 2 * D * KV + D * D + 3 * D * F) // t  # norms replicated
    hand = 2 * (V // t) * D + L * per_layer + D  # vocab-parallel embedding and lm_head, final norm whole
    est = estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", parallel=Parallel(tp=t))
    assert est.device_params == hand
    assert est.params == hand * 4
    assert est.grads == hand * 4
    assert est.logits == 2 * 32 * (V // t) * 4


def test_tensor_parallel_params_gpt2_rounds_the_vocabulary_up() -> None:
    t = 4
    per_layer = (2 * 2 * GD  # two LayerNorms (weight, bias), replicated
                 + (GD * 3 * GD + 3 * GD) // t  # c_attn weight and bias, column-parallel
                 + GD * GD // t + GD  # attention c_proj: row-parallel weight, whole bias
                 + (GD * 4 * GD + 4 * GD) // t  # c_fc
                 + 4 * GD * GD // t + GD)  # mlp c_proj
    hand = math.ceil(GV / t) * GD + GP * GD + GL * per_layer + 2 * GD  # wte split, wpe and ln_f whole
    est = estimate_memory(GPT2, batch=2, seq_len=32, attention="sdpa", parallel=Parallel(tp=t))
    assert est.device_params == hand


def test_pipeline_stages_hold_their_layers_and_the_embeddings_at_the_ends() -> None:
    from lmprof.estimate.memory.params import param_parts
    from lmprof.estimate.memory.share import device_share

    per_layer = 2 * D + D * D + 2 * D * KV + D * D + 3 * D * F
    p = 2
    first = device_share(LLAMA, param_parts(LLAMA), par=Parallel(pp=p), lora=None, stage=0, param_dtype="fp32",
                         dtype="fp32", batch=2, seq_len=32)
    last = device_share(LLAMA, param_parts(LLAMA), par=Parallel(pp=p), lora=None, stage=p - 1, param_dtype="fp32",
                        dtype="fp32", batch=2, seq_len=32)
    assert first.params == V * D + (L // p) * per_layer
    assert last.params == (L // p) * per_layer + D + V * D
    assert (first.in_flight, last.in_flight) == (p, 1)
    # 3 layers over 2 stages: the first stage takes the extra one. Tied GPT-2: the last stage keeps a copy.
    three = ModelShape(n_layer=3, n_head=4, n_embd=GD, vocab_size=GV, block_size=GP, family="gpt2")
    g_layer = 2 * 2 * GD + GD * 3 * GD + 3 * GD + GD * GD + GD + GD * 4 * GD + 4 * GD + 4 * GD * GD + GD
    f3 = device_share(three, param_parts(three), par=Parallel(pp=2), lora=None, stage=0, param_dtype="fp32",
                      dtype="fp32", batch=2, seq_len=32)
    l3 = device_share(three, param_parts(three), par=Parallel(pp=2), lora=None, stage=1, param_dtype="fp32",
                      dtype="fp32", batch=2, seq_len=32)
    assert f3.params == GV * GD + GP * GD + 2 * g_layer
    assert l3.params == g_layer + 2 * GD + GV * GD


def _paper_regime(parallel: Parallel) -> MemoryEstimate:
    """Korthikanti's own regime: 16-bit tensors, dropout on, unfused attention, bool masks (CUDA)."""
    return estimate_memory(TINY, batch=2, seq_len=128, param_dtype="bf16", attention="math", dropout=0.1,
                           device_kind="cuda", parallel=parallel)


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_and_sequence_parallel_activations_follow_the_paper(t: int) -> None:
    s, b, h, a = 128, 2, TINY.n_embd, TINY.n_head
    sbh = s * b * h
    stats = 2 * (2 * s * b * 4)  # two LayerNorms' fp32 mean and rstd (not in the paper)
    mask = s * s  # the causal mask (not in the paper, the same on every rank)
    tp = _paper_regime(parallel=Parallel(tp=t))
    assert tp.activations_per_layer == sbh * (10 + 24 / t + 5 * a * s / (h * t)) + stats + mask
    sp = _paper_regime(parallel=Parallel(tp=t, sp=True))
    assert sp.activations_per_layer == sbh / t * (34 + 5 * a * s / h) + stats / t + mask


def test_pipeline_first_stage_holds_p_micro_batches() -> None:
    s, b, h, a = 128, 2, TINY.n_embd, TINY.n_head
    sbh = s * b * h
    t, p = 2, 2
    per_layer = sbh / t * (34 + 5 * a * s / h) + 2 * (2 * s * b * 4) / t + s * s
    embedding_once = s * 8 + sbh // t  # positions (int64, whole) and the embedding's dropout mask (split by SP)
    est = _paper_regime(parallel=Parallel(tp=t, sp=True, pp=p))
    assert any("first pipeline stage" in line for line in est.plan)
    assert est.activations == p * ((TINY.n_layer // p) * per_layer + embedding_once)
    assert est.logits == 0  # the lm_head lives on the last stage


def test_last_stage_reported_when_the_vocabulary_dominates() -> None:
    big = ModelShape(n_layer=2, n_head=4, n_embd=GD, vocab_size=50_000, block_size=GP, family="gpt2")
    t, p, s, b = 2, 2, 32, 2
    g_layer = (2 * 2 * GD + (GD * 3 * GD + 3 * GD) // t + GD * GD // t + GD + (GD * 4 * GD + 4 * GD) // t
               + 4 * GD * GD // t + GD)
    est = estimate_memory(big, batch=b, seq_len=s, attention="sdpa", parallel=Parallel(tp=t, pp=p))
    assert any("last pipeline stage" in line for line in est.plan)
    assert est.device_params == g_layer + 2 * GD + (50_000 // t) * GD  # one layer, ln_f, its copy of the tied wte
    assert est.logits == b * s * (50_000 // t) * 4


def test_inference_per_rank_params_and_kv_cache() -> None:
    t, b, s = 2, 3, 40
    est = estimate_memory(LLAMA, batch=b, seq_len=s, mode="infer", attention="sdpa", parallel=Parallel(tp=t))
    per_layer = 2 * D + (D * D + 2 * D * KV + D * D + 3 * D * F) // t
    assert est.params == (2 * (V // t) * D + L * per_layer + D) * 4
    assert est.kv_cache == 2 * L * (KVH // t) * (D // H) * s * b * 4  # keys and values of this rank's heads
    assert est.logits == b * (V // t) * 4


def test_no_plan_equals_the_plain_estimate_exactly() -> None:
    for shape, attention in ((LLAMA, "sdpa"), (GPT2, "sdpa"), (TINY, "math")):
        for kw in ({}, {"param_dtype": "bf16"}, {"dtype": "bf16"}):
            plain = estimate_memory(shape, batch=2, seq_len=32, attention=attention, **kw)  # type: ignore[arg-type]
            same = estimate_memory(shape, batch=2, seq_len=32, attention=attention, parallel=Parallel(1, 1),
                                   **kw)  # type: ignore[arg-type]
            assert same == plain
            plan = estimate_plan(shape, batch=2, seq_len=32, attention=attention, parallel=Parallel(),
                                 **kw)  # type: ignore[arg-type]
            assert plan.peak == estimate_plan(shape, batch=2, seq_len=32, attention=attention,
                                              **kw).peak  # type: ignore[arg-type]


def test_zero_shards_the_per_device_figures_over_the_data_parallel_degree() -> None:
    t, gpus = 2, 4
    per_layer = 2 * D + (D * D + 2 * D * KV + D * D + 3 * D * F) // t
    dev = 2 * (V // t) * D + L * per_layer + D
    kw = dict(batch=2, seq_len=32, dtype="fp32", param_dtype="fp32", optimizer="sgd", parallel=Parallel(tp=t))
    z1 = estimate_plan(LLAMA, gpus=gpus, shard="zero1", **kw)  # type: ignore[arg-type]
    assert (z1.params, z1.grads, z1.optimizer_state) == (dev * 4, dev * 4, dev * 4 // gpus)
    z3 = estimate_plan(LLAMA, gpus=gpus, shard="zero3", **kw)  # type: ignore[arg-type]
    assert (z3.params, z3.grads, z3.optimizer_state) == (dev * 4 // gpus, dev * 4 // gpus, dev * 4 // gpus)
    # LoRA + ZeRO-2: frozen base replicated, adapter gradients and momentum split.
    a = _llama_adapters(8, all_linear=False)
    z2 = estimate_plan(LLAMA, gpus=gpus, shard="zero2", batch=2, seq_len=32, dtype="fp32", param_dtype="fp32",
                       optimizer="sgd", lora=Lora(8))
    assert (z2.params, z2.grads, z2.optimizer_state) == ((_llama_params() + a) * 4, a * 4 // gpus, a * 4 // gpus)


@pytest.mark.parametrize("kw, message", [
    ({"parallel": Parallel(tp=3)}, "must divide the attention heads"),
    ({"parallel": Parallel(tp=4)}, "key/value heads"),  # 2 KV heads
    ({"parallel": Parallel(pp=5)}, "exceeds the model's 4 layers"),
    ({"parallel": Parallel(sp=True)}, "needs --tp 2"),
    ({"lora": Lora(0)}, "--lora-rank"),
    ({"lora": Lora(8), "mode": "infer"}, "for training"),
])
def test_refusals(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        estimate_memory(LLAMA, batch=2, seq_len=32, attention="sdpa", **kw)  # type: ignore[arg-type]


# -- the command -----------------------------------------------------------------------------------

def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["memory", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args", [
    ["--tp", "3"], ["--sp"], ["--pp", "9"], ["--qlora"], ["--lora-rank", "0"], ["--lora-targets", "all-linear"],
    ["--lora-rank", "8", "--lora-targets", "mlp"], ["--lora-rank", "8", "--mode", "infer"], ["--tp", "0"],
    ["--tp", "2", "--checkpointing"],
])
def test_cli_refuses_in_one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, out, err = _run(capsys, "--preset", "tiny", "--device", "cpu", "--memory-gb", "1", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""


def test_cli_shows_the_plan_and_checks_the_per_device_peak(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--preset", "tiny", "--batch-size", "8", "--seq-len", "128", "--device", "cpu"]
    whole = estimate_plan(TINY, batch=8, seq_len=128, dtype="fp32", param_dtype="fp32", attention="math",
                          device_kind="cpu").peak
    split = estimate_plan(TINY, batch=8, seq_len=128, dtype="fp32", param_dtype="fp32", attention="math",
                          device_kind="cpu", parallel=Parallel(tp=4, sp=True)).peak
    assert split < whole
    budget = str((whole + split) / 2 / 1024**3)
    code, out, _ = _run(capsys, *base, "--memory-gb", budget, "--tp", "4", "--sp")
    assert code == 0, out
    assert "plan: tensor parallel 4 + sequence parallel" in out
    assert "devices: 1 data-parallel x 4 tensor-parallel x 1 pipeline = 4 devices" in out
    code, out, _ = _run(capsys, *base, "--memory-gb", budget)
    assert code == 1
    code, out, _ = _run(capsys, *base, "--memory-gb", budget, "--tp", "4", "--sp", "--json")
    data = json.loads(out)
    assert data["devices"] == 4 and data["peak"] == split
    per_layer = 2 * 2 * 128 + (128 * 3 * 128 + 3 * 128 + 128 * 128 + 128 * 512 + 512 + 512 * 128) // 4 + 2 * 128
    assert data["estimate"]["device_params"] == math.ceil(65 / 4) * 128 + 256 * 128 + 4 * per_layer + 2 * 128
    code, out, _ = _run(capsys, *base, "--memory-gb", "4", "--lora-rank", "4", "--qlora", "--no-blocks")
    assert code == 0 and "plan: QLoRA rank 4 on q, k, v, o" in out


# -- against peft --------------------------------------------------------------------------------

def _tiny_hf(family: str) -> Any:
    import transformers

    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=D, intermediate_size=F, num_attention_heads=H, num_key_value_heads=KVH, num_hidden_layers=L,
            vocab_size=V, max_position_embeddings=128))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=GD, n_head=4, n_layer=GL, vocab_size=GV,
                                                                 n_positions=GP))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("targets", ["attn", "all-linear"])
def test_lora_counts_match_peft(family: str, targets: str) -> None:
    """Trainable parameters of a real peft model on a tiny random transformers config (skipped without peft)."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from lmprof.estimate.models import shape_from_config

    model = _tiny_hf(family)
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"] if family == "llama" else ["c_attn", "attn.c_proj"]
    lora_model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=attn if targets == "attn"
                                                            else "all-linear"))
    trainable, _ = lora_model.get_nb_trainable_parameters()
    est = estimate_memory(shape_from_config(model.config.to_dict()), batch=1, seq_len=16, attention="sdpa",
                          lora=Lora(8, targets))  # type: ignore[arg-type]
    assert est.trainable_params == trainable
