"""Module-hook block names for Hugging Face families and for models lmprof has no rules for.

The truth is the family's module layout as transformers builds it (tiny random configs), mapped by
hand to the canonical block each module computes.
"""
from __future__ import annotations

import pytest
import torch

from lmprof.names import folded
from lmprof.workloads.hooks import block_names

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def _names(config: object) -> dict[str, str]:
    model = transformers.AutoModelForCausalLM.from_config(config)
    return {path: name for path, name in block_names(model).items() if ".1." not in path and not path.endswith(".1")}


def test_gemma2_norms_around_attention_and_mlp() -> None:
    n = _names(transformers.Gemma2Config(**SMALL, num_key_value_heads=1, head_dim=16))
    layer = "model.layers.0."
    assert n[layer + "input_layernorm"] == "ln_1" and n[layer + "post_attention_layernorm"] == "ln_1"
    assert n[layer + "pre_feedforward_layernorm"] == "ln_2" and n[layer + "post_feedforward_layernorm"] == "ln_2"
    assert n[layer + "self_attn.q_proj"] == "attn.qkv" and n[layer + "mlp.down_proj"] == "mlp.proj"
    assert n["model.norm"] == "ln_f" and n["lm_head"] == "lm_head"


def test_phi_parallel_block() -> None:
    n = _names(transformers.PhiConfig(**SMALL))
    layer = "model.layers.0."
    assert (n[layer + "self_attn.dense"], n[layer + "mlp.fc1"], n[layer + "mlp.activation_fn"], n[layer + "mlp.fc2"]) == (
        "attn.proj", "mlp.fc", "mlp.act", "mlp.proj")
    assert n["model.final_layernorm"] == "ln_f" and n["model.embed_tokens"] == "embedding"


def test_phi3_fused_projections() -> None:
    n = _names(transformers.Phi3Config(**SMALL, pad_token_id=0))
    layer = "model.layers.0."
    assert n[layer + "self_attn.qkv_proj"] == "attn.qkv" and n[layer + "mlp.gate_up_proj"] == "mlp.fc"
    assert n[layer + "mlp.activation_fn"] == "mlp.act"


def test_gpt_neox() -> None:
    n = _names(transformers.GPTNeoXConfig(**SMALL))
    layer = "gpt_neox.layers.0."
    assert n["gpt_neox.embed_in"] == "embedding" and n["gpt_neox.final_layer_norm"] == "ln_f"
    assert n[layer + "attention.query_key_value"] == "attn.qkv" and n[layer + "attention.dense"] == "attn.proj"
    assert n[layer + "attention"] in ("attn.core", "attn.sdpa")
    assert (n[layer + "mlp.dense_h_to_4h"], n[layer + "mlp.act"], n[layer + "mlp.dense_4h_to_h"]) == (
        "mlp.fc", "mlp.act", "mlp.proj")
    assert n[layer + "post_attention_layernorm"] == "ln_2" and n["lm_head"] == "lm_head"


def test_unknown_model_keeps_layers_apart_and_tables_fold_them() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(3))
            self.head = torch.nn.Linear(4, 2)

    n = block_names(Net())
    assert n["blocks.2.0"] == "blocks.*.0[2]" and n["blocks.0.1"] == "blocks.*.1[0]" and n["head"] == "head"
    assert "blocks.0" not in n  # containers get no scope of their own: leaves only
    assert folded("blocks.*.0[2]") == "blocks.*.0" and folded("a.*.b.*.c[1,3]") == "a.*.b.*.c"
    assert folded("attn.qkv") == "attn.qkv" and folded("x[y]") == "x[y]"
