"""The families added in issue 31 against transformers' own tiny random-weight models.

Each config is the family's published layout shrunk (4 layers, width 64), built with the
transformers config class, never downloaded. Truths: ``sum(p.numel())`` of the built model (total),
the same minus the experts a token does not use (active), FlopCounterMode's matmul FLOPs for a
training forward + backward, a prefill and one decode step, and the bytes of the cache tensors the
model returns after a prefill and one decode step.
"""
from __future__ import annotations

from dataclasses import astuple, replace

import pytest

from lmprof.errors import ConfigError
from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.estimate.models import shape_from_config

tf = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from lmprof.measure.flops import count_causal_lm_flops  # noqa: E402

ALL = FlopConventions(prefill_logits="all")
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# Each family's distinguishing fields, as its published config sets them (sizes shrunk).
TINY: dict[str, dict] = {
    "gemma": dict(hidden_activation="gelu_pytorch_tanh"),
    "qwen3": {},
    "gemma3_text": dict(sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "olmo2": {},
    "smollm3": dict(no_rope_layer_interval=4),
    "phi": dict(num_key_value_heads=4),
    "phi-qk-layernorm": dict(model_type="phi", num_key_value_heads=4, qk_layernorm=True),
    "gpt_bigcode": dict(n_embd=64, n_layer=4, n_head=4, n_positions=64, n_inner=96),
    "gpt_bigcode-mha": dict(model_type="gpt_bigcode", n_embd=64, n_layer=4, n_head=4, n_positions=64,
                            multi_query=False),
    "qwen3_moe": dict(num_experts=6, **MOE),
    "qwen3_moe-dense-layers": dict(model_type="qwen3_moe", num_experts=6, mlp_only_layers=[0], decoder_sparse_step=2,
                                   **MOE),
    "gpt_oss": dict(num_local_experts=6, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    "llama4_text": dict(num_local_experts=6, num_experts_per_tok=1, intermediate_size_mlp=80,
                        interleave_moe_layer_step=2, attention_chunk_size=8),
    "glm4_moe": dict(n_routed_experts=6, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                     attention_bias=True, use_qk_norm=True, **MOE),
    "deepseek_v3": dict(n_routed_experts=6, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                        q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                        head_dim=8, num_key_value_heads=4, **MOE),
    "deepseek_v2": dict(n_routed_experts=6, n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                        q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                        head_dim=8, num_key_value_heads=4, **MOE),
    "deepseek_v3-no-q-lora": dict(model_type="deepseek_v3", n_routed_experts=6, n_shared_experts=2,
                                  first_k_dense_replace=2, n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=16,
                                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, head_dim=8,
                                  num_key_value_heads=4, **MOE),
}
B, T = 2, 12


def build(name: str):
    cfg = {**BASE, **TINY[name]}
    model_type = cfg.pop("model_type", name)
    hc = tf.AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(hc, attn_implementation="eager", experts_implementation="eager")
    return model.eval(), shape_from_config(hc.to_dict())


def _expert_tensors(model) -> list:
    """The routed experts' parameters, one entry per MoE layer: (tensors, number of experts)."""
    out = []
    for name, module in model.named_modules():
        if name.endswith(".experts") and hasattr(module, "down_proj"):
            out.append([p for p in module.parameters(recurse=False)])
    return out


def _matmul(shape, phase: str, seq: int, context: int | None = None) -> float:
    return sum(c.matmul_flops for c in block_costs(shape, batch=B, seq_len=seq, phase=phase, dtype="fp32",
                                                   conventions=ALL, context=context))


@pytest.mark.parametrize("name", list(TINY))
def test_params_total_and_active_equal_the_built_model(name: str) -> None:
    model, shape = build(name)
    total = sum(p.numel() for p in model.parameters())
    assert shape.n_params() == total
    # Active: every routed expert's tensors scaled to the top_k a token uses (E is the tensors' first dimension).
    unused = sum(p.numel() * (p.shape[0] - shape.top_k) // p.shape[0] for layer in _expert_tensors(model)
                 for p in layer)
    assert shape.n_params(active=True) == total - unused
    assert (shape.n_experts > 0) == bool(unused)


def _unrouted(shape, tokens: int) -> int:
    """Hugging Face's Llama 4 runs every token through every expert (unrouted ones scaled by 0): the matmul
    FLOPs of the E - top_k experts lmprof does not count, by hand: 2 x tokens x 3 x d x d_ff_expert each."""
    if shape.family != "llama4_text":
        return 0
    return shape.n_moe_layers * 2 * tokens * 3 * shape.n_embd * shape.expert_ffn * (shape.n_experts - shape.top_k)


@pytest.mark.parametrize("name", list(TINY))
def test_flops_equal_flop_counter_mode(name: str) -> None:
    model, shape = build(name)
    train, prefill, decode = astuple(count_causal_lm_flops(model, torch.randint(3, 128, (B, T))))
    assert prefill - _unrouted(shape, B * T) == pytest.approx(_matmul(shape, "prefill", T), rel=0.01)
    assert train - 3 * _unrouted(shape, B * T) == pytest.approx(
        _matmul(shape, "forward", T) + _matmul(shape, "backward", T), rel=0.01)
    assert decode - _unrouted(shape, B) == pytest.approx(_matmul(shape, "decode", T + 1), rel=0.01)


@pytest.mark.parametrize("name", list(TINY))
def test_kv_cache_bytes_equal_the_returned_cache(name: str) -> None:
    model, shape = build(name)
    ids = torch.randint(3, 128, (B, T))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        cache = model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == shape.kv_cache_elements(T + 1) * B * 4


def test_unknown_family_is_the_describers_and_the_guess_only_when_asked(tmp_path) -> None:
    """A family without formulas resolves to the describer (no shape, the config kept); the generic guess
    is a separate step, marked generic, with a warning, and refused for expert / hybrid / latent configs."""
    import json

    from lmprof.estimate.models import generic_entry, resolve_model

    cfg = {"model_type": "my_llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 96, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    entry = resolve_model(str(tmp_path))
    assert entry.figures == "model" and entry.shape is None and entry.config == cfg and not entry.warning
    guess = generic_entry(entry)
    assert guess.figures == "generic" and "GENERIC Llama-like guess" in guess.warning
    assert guess.shape is not None and guess.shape.family == "my_llama"
    # By hand: embeddings 128x64, lm_head 128x64, per layer 4 x 64x64 attention + 3 x 64x96 MLP + 2 norms, final norm.
    assert guess.shape.n_params() == 2 * 128 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 64
    for extra, what in (({"num_local_experts": 8}, "expert"), ({"mamba_d_state": 16}, "hybrid-layer"),
                        ({"layer_types": ["full_attention", "linear_attention"]}, "hybrid-layer"),
                        ({"kv_lora_rank": 512}, "latent-attention")):
        with pytest.raises(ConfigError, match=f"no generic guess for 'my_llama': it has {what} fields"):
            generic_entry(replace(entry, config={**cfg, **extra}))


def test_unknown_family_on_the_command_line(tmp_path, capsys) -> None:
    """A config the describer cannot build: one line naming why, exit 2; with --allow-generic the guess,
    its warning on stderr and ``source: generic`` in --json; refused (exit 2) for an expert config."""
    import json

    from lmprof.cli.main import main

    cfg = {"model_type": "my_llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 96, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for verb in (["memory"], ["roofline", "--phase", "train"]):
        assert main([*verb, "--model", str(tmp_path), "--device", "h100", "--batch-size", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "'my_llama'" in err[0] and "--allow-generic" in err[0], err
    assert main(["memory", "--model", str(tmp_path), "--device", "h100", "--batch-size", "1", "--allow-generic",
                 "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["source"] == "generic" and "warning: 'my_llama' figures are a GENERIC" in out.err
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_local_experts": 8, "num_experts_per_tok": 2}))
    assert main(["roofline", "--model", str(tmp_path), "--device", "h100", "--allow-generic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no generic guess for 'my_llama': it has expert fields" in err[0]


def test_moe_flop_note_states_the_active_n_the_value_uses() -> None:
    """The note's N is the active non-embedding count, and B·T·(6N + 12·L·d·T) with it is the value."""
    from lmprof.estimate.mfu import mfu_metrics
    from lmprof.estimate.models import resolve_model

    shape = resolve_model("mixtral-8x7b").shape
    m = mfu_metrics(shape, batch=2, seq_len=128, mode="train", time_s=1.0, device_name="h100", device_kind="cuda")
    n_active = shape.n_params_non_embedding(active=True)
    assert f"N={n_active:,} non-embedding params active per token (top-2 of 8 experts)" in m["flops.model_per_step"].note
    by_hand = 2 * 128 * (6 * n_active + 12 * shape.n_layer * shape.n_embd * 128)
    assert m["flops.model_per_step"].value == pytest.approx(by_hand, rel=1e-12)


def test_family_table_names_a_published_config_for_every_family() -> None:
    """Every supported family has a row; its example is a table entry of that family with a source URL, and
    every key the example sets is one the row says lmprof reads."""
    from lmprof.estimate.models import SUPPORTED, _table, family_table

    families = family_table()
    assert set(families) == set(SUPPORTED)
    for family, row in families.items():
        if row["example"] is None:  # gemma, deepseek_v2: no table entry, the tiny configs above are their check
            continue
        entry = _table()[row["example"]]
        assert entry["config"]["model_type"] == family
        assert entry["source"].startswith("https://huggingface.co/") and entry["source"].endswith("config.json")
        assert set(entry["config"]) - {"model_type"} <= set(row["reads"]) | set(row["ignored"]), family


def test_deepseek_v3_kv_cache_is_the_compressed_latent() -> None:
    """By hand: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) elements per token, 2 bytes in bf16,
    where 128 heads x (192 + 128) per layer would be 9.1x more."""
    from lmprof.estimate.memory import kv_cache_bytes
    from lmprof.estimate.models import resolve_model

    shape = resolve_model("deepseek-v3").shape
    assert shape.kv_elements_per_token() == 61 * (512 + 64) == 35_136
    assert kv_cache_bytes(shape, 1, 4096, 2) == 35_136 * 4096 * 2


def test_estimate_imports_no_torch() -> None:
    """Every module of lmprof.estimate imports without loading torch (an estimate needs no torch)."""
    import subprocess
    import sys

    code = ("import pkgutil, importlib, sys, lmprof.estimate as e\n"
            "for m in pkgutil.walk_packages(e.__path__, 'lmprof.estimate.'):\n"
            "    importlib.import_module(m.name)\n"
            "e.mfu_metrics, e.estimate_memory, e.shape_from_config\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print(len(list(pkgutil.walk_packages(e.__path__, 'lmprof.estimate.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 15


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_rows_flops_equal_flop_counter_mode_per_module(name: str) -> None:
    """The router and the routed experts are rows of their own (issue 31), the shared experts a dense
    MLP's: each row's analytic prefill FLOPs equal FlopCounterMode's count inside the modules the row's
    measured time comes from (lmprof's own module -> block mapping, the one a measured run uses)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmprof.workloads.hooks import block_names

    cfg = {**BASE, **TINY.get(name, MOE | dict(num_local_experts=6, num_experts=6))}
    cfg.pop("model_type", None)
    if name == "qwen2_moe":
        cfg.update(shared_expert_intermediate_size=48)
    hc = tf.AutoConfig.for_model(name, **cfg)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(hc, attn_implementation="eager", experts_implementation="eager").eval()
    shape = shape_from_config(hc.to_dict())
    mapping = block_names(model)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(input_ids=torch.randint(3, 128, (B, T)))
    prefix = type(model).__name__ + "."
    inclusive = {fqn.removeprefix(prefix): sum(ops.values()) for fqn, ops in fc.get_flop_counts().items()}
    counted: dict[str, int] = {}
    for path, flops in inclusive.items():
        block = mapping.get(path)
        if block not in ("moe.router", "moe.experts", "mlp.fc", "mlp.proj"):
            continue
        # a module's own FLOPs: its inclusive count less its direct children's (as its time is exclusive)
        children = sum(f for p, f in inclusive.items() if p.rpartition(".")[0] == path)
        counted[block] = counted.get(block, 0) + flops - children
    want = {c.name: c.matmul_flops for c in block_costs(shape, batch=B, seq_len=T, phase="prefill", dtype="fp32",
                                                          conventions=ALL)
            if c.name in ("moe.router", "moe.experts", "mlp.fc", "mlp.proj")}
    assert want.keys() == counted.keys(), (want, counted)
    for block, flops in want.items():
        assert counted[block] == pytest.approx(flops, rel=1e-6), block
