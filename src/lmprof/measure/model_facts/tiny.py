"""One shared recipe for a tiny config of any transformers causal-LM family: its defaults, every size shrunk.

Used to check the describer against transformers' own random-weight models family by family
(tests/test_model_facts*.py, scripts/family_walk.py). The family's layout is kept: per-layer
patterns keep one layer of every kind they mix (attention, linear attention, SSM, convolution,
dense and MoE MLPs), experts stay experts, latent attention stays latent. Sizes go to a width of
64, 4 layers, 4 heads (2 key/value heads), a vocabulary of 128; nested configs (a multimodal
model's text and vision parts) shrink the same way. A family whose own transformers defaults do not
build a model that runs gets what its checkpoints set (:data:`FIXES`, each with its reason).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from lmprof.workloads.hf import nested_configs

LAYERS = 4
# Config keys and the value every family gets, where its config has the key (an int there).
SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim", "model_dim", "dim", "n_embed"), 64),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size", "intermediate_size_mlp",
                     "mlp_dim", "inner_hidden_size", "decoder_ffn_dim", "encoder_ffn_dim", "hidden_dim"), 96),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                     "moe_shared_expert_intermediate_size", "shared_intermediate_size"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
                     "num_decoder_layers", "num_encoder_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
                     "encoder_attention_heads", "num_query_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "n_kv_heads",
                     "num_key_value_groups"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "head_size", "d_head"), 16),
    **dict.fromkeys(("vocab_size", "n_vocab", "vocab_size_per_layer_input", "unpadded_vocab_size"), 128),
    "emb_dim": 64, "hidden_size_per_layer_input": 16, "adapter_in_dim": 64, "adapter_out_dim": 64,
    "adapter_input_size": 64,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx",
                     "max_sequence_length", "original_max_position_embeddings"), 128),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_top_k"), 2),
    "n_shared_experts": 1, "num_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "qk_head_dim": 24,
    # linear attention (Gated DeltaNet and kin)
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    # state-space mixers (Mamba 1/2)
    "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1,
    "ssm_state_size": 16, "state_size": 16, "mamba_head_dim": 16, "mamba_num_heads": 4, "time_step_rank": 8,
    "mamba_expand": 2, "n_groups": 1, "mamba_chunk_size": 16, "chunk_size": 16,
    "mamba_headdim": 16, "n_mamba_heads": 8, "adapter_rank": 8, "rotary_dim": 8,
    # where attention and experts sit in a hybrid stack (Jamba): every other layer
    "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
    "attention_hidden_size": 64, "attention_head_dim": 32, "embedding_dim": 64, "num_blocks": LAYERS,
    "linear_head_dim": 16, "linear_num_heads": 4, "num_expert_group": 1, "layer_group_size": 2,
    "context_length": 128, "model_max_length": 128, "decoder_vocab_size": 128, "n_words": 128,
    "sliding_window": 8, "attention_chunk_size": 8, "window_size": 8,
}
# Lists of layer indices (which layers attend, which are dense): kept below LAYERS, at least one.
_INDEX_LISTS = ("mlp_only_layers", "moe_layers", "no_rope_layers_ids", "full_attn_idxs", "attn_layer_indices",
                "hybrid_layer_ids")
_TOKEN_SUFFIX = "_token_id"
# Sizes some families leave None by default although their model reads a number there (a checkpoint
# sets them): filled with the value they would derive to, so the layout stays the family's.
_UNSET: dict[str, Callable[[Any], int]] = {"head_dim": lambda p: p.hidden_size // p.num_attention_heads,
                                           "num_key_value_heads": lambda p: p.num_attention_heads}
# Families whose transformers defaults do not build a model that runs (every checkpoint of theirs sets
# these): the values such a checkpoint has, at the recipe's sizes. A key is set on every part of the
# config that has it, else on the config itself; ``a.b`` sets ``b`` of the nested config ``a``.
# scripts/family_walk.py shows what each one gains.
FIXES: dict[str, dict[str, Any]] = {
    # attention layers among the SSM ones (the defaults have none, and transformers' masks need one);
    # Mamba heads x head size = 2 x the width, as in the family's checkpoints
    "bamba": {"attn_layer_indices": [1], "mamba_d_head": 32},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
                         "mamba_d_head": 32},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},  # None by default
    # expert counts and the sparse-attention indexer's sizes, None by default
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                                                     "indexer_budget": 8, "indexer_compress_ratio": 4}),
    # the attention reads rope_theta from attn_config, which lacks it; clip_qkv None fails torch.clamp
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    # its causal LM refuses an encoder config; the axial position embeddings must cover the width and
    # the sequence (the family walk's 12 tokens), and the attention chunks divide it
    "reformer": {"is_decoder": True, "axial_pos_shape": (3, 4), "axial_pos_embds_dim": (32, 32),
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 2},
    # its sliding-window layers' heads are whole (nope + rope of their own, 24 + 8), not latent ones
    **dict.fromkeys(("dots3_note", "dots3_note_text"), {"head_dim": 32}),
    "zaya": {"num_experts_per_tok": 1},  # its config refuses any other top-k when read from a file
    # layer counts that must add up to num_hidden_layers
    "dory": {"n_input_layers": 1, "n_recurrent_layers": 2, "n_output_layers": 1},
    "hrm_text": {"num_layers_per_stack": 1, "L_cycles": 1, "L_bp_cycles": [1]},
    # two hybrid (shared-attention) layers, whose attention reads the residual and the embeddings
    # side by side: twice the width
    "zamba": {"layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"],
              "attention_hidden_size": 128},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"],
               "hybrid_layer_ids": [1, 3], "attention_hidden_size": 128},
    # the last layers reuse the caches of earlier layers of their own kind: one of each kind before them
    "gemma3n_text": {"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                     "num_kv_shared_layers": 2},
    # its cache rounds the key width up to a multiple of 64 and its layers do not: a width where both agree
    "xlstm": {"hidden_size": 128, "embedding_dim": 128},
    # at 12 tokens a block-sparse BigBird runs full attention (with a warning); the config says so itself
    "big_bird": {"attention_type": "original_full"},
    # the default rope_parameters are empty, and each layer type looks its own up
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
}


def _keep(n_old: int, values: list[Any]) -> list[int]:
    """Indices of ``LAYERS`` layers of an ``n_old``-layer pattern: the first of every kind, then in order."""
    first: dict[str, int] = {}
    for i, v in enumerate(values):
        first.setdefault(repr(v), i)
    picked = sorted(first.values())[:LAYERS]
    for i in range(n_old):
        if len(picked) >= LAYERS:
            break
        if i not in picked:
            picked.append(i)
    return sorted(picked)


def _set(cfg: Any, key: str, value: Any) -> None:
    try:
        setattr(cfg, key, value)
    except (AttributeError, TypeError, ValueError):  # read-only properties, validated fields
        pass


def shrink(cfg: Any) -> Any:
    """``cfg`` (a transformers config) with every size of :data:`SIZES` it has set small, in place."""
    for part in nested_configs(cfg):
        if vars(part).get("_heterogeneity_spec") is not None:  # per-layer sizes: the global ones are shrunk
            _set(part, "allow_global_per_layer_attribute_access", True)
        fields = dict(vars(part))
        n_old = next((fields[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
                      if isinstance(fields.get(k), int)), None)
        for key, value in SIZES.items():
            if isinstance(fields.get(key), int) and not isinstance(fields.get(key), bool):
                _set(part, key, value)
            elif key == "num_experts_per_tok" and key in fields and fields[key] is None:
                _set(part, key, value)  # a family whose default leaves top-k unset (DeepSeek-V2)
        if isinstance(n_old, int) and n_old > LAYERS:
            for key, value in fields.items():
                if isinstance(value, (list, str)) and len(value) == n_old and not key.endswith("_token_id"):
                    keep = _keep(n_old, list(value))
                    picked = [value[i] for i in keep]
                    _set(part, key, "".join(picked) if isinstance(value, str) else picked)
                elif key in _INDEX_LISTS and isinstance(value, list) and all(isinstance(i, int) for i in value):
                    _set(part, key, [i for i in value if i < LAYERS] or ([1] if value else []))
        for key, derive in _UNSET.items():
            if key in fields and fields[key] is None:
                with contextlib.suppress(AttributeError, TypeError, ZeroDivisionError):  # a part without them
                    _set(part, key, derive(part))
        _derive(part, fields)
        vocab = getattr(part, "vocab_size", None)
        if isinstance(vocab, int):
            for key, value in fields.items():
                if key.endswith(_TOKEN_SUFFIX) and isinstance(value, int) and value >= vocab:
                    _set(part, key, min(value, vocab - 1) if key == "pad_token_id" else 2)
                elif key.endswith(_TOKEN_SUFFIX) and isinstance(value, list):
                    _set(part, key, [v if v < vocab else 2 for v in value if isinstance(v, int)])
            if getattr(part, "pad_token_id", None) is None and "pad_token_id" in fields:
                _set(part, "pad_token_id", 0)
        if "allow_global_per_layer_attribute_access" in vars(part):
            _set(part, "allow_global_per_layer_attribute_access", False)
    return cfg


def _derive(part: Any, fields: dict[str, Any]) -> None:
    """Sizes that must agree with others: latent attention's rotary head, a Mamba-2 stack's heads."""
    rope = getattr(part, "qk_rope_head_dim", None)
    if isinstance(fields.get("qk_rope_head_dim"), int) and isinstance(rope, int):
        if "head_dim" in fields:
            _set(part, "head_dim", rope)  # latent attention's head_dim is the rotary part
        if "qk_head_dim" in fields:
            _set(part, "qk_head_dim", rope + int(getattr(part, "qk_nope_head_dim", 0) or 0))
        if isinstance(fields.get("kv_lora_rank"), int) and "num_key_value_heads" in fields:
            _set(part, "num_key_value_heads", part.num_attention_heads)  # keys and values per head from the latent
    if all(isinstance(fields.get(k), int) for k in ("expand", "head_dim", "num_heads", "hidden_size")):
        _set(part, "num_heads", part.expand * part.hidden_size // part.head_dim)


def tiny_config(model_type: str) -> Any:
    """The tiny config of a family: its transformers defaults shrunk by :func:`shrink`."""
    from lmprof.workloads.hf import _transformers

    tf = _transformers()
    full = tf.AutoConfig.for_model(model_type)
    before = full.to_dict()  # shrink works in place
    cfg = _fixed(shrink(full), model_type)
    after = cfg.to_dict()
    if _per_layer(before, after):  # a heterogeneous config: rebuilt from its dict, which it validates
        after.pop("model_type", None)
        cfg = tf.AutoConfig.for_model(model_type, **after)
    return cfg


def _per_layer(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Move the per-layer overrides of a heterogeneous config (transformers' ``per_layer_config``:
    Gemma 4's full-attention layers with a head size of their own) to the layers the recipe kept, their
    sizes shrunk as the global ones were; overrides of layers left out go. In the dicts of the full and
    the shrunk config, nested parts included; True when there was any."""
    found = False
    for key, value in after.items():
        if isinstance(value, dict) and isinstance(before.get(key), dict) and key != "per_layer_config":
            found |= _per_layer(before[key], value)
    overrides = before.get("per_layer_config")
    n_old = before.get("num_hidden_layers")
    if not isinstance(overrides, dict) or not overrides or not isinstance(n_old, int):
        return found
    kinds = before.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != n_old:  # no kinds named: the overrides are the kinds
        kinds = [repr(overrides.get(f"{i:02d}", overrides.get(str(i)))) for i in range(n_old)]
    kept = _keep(n_old, kinds) if n_old > LAYERS else list(range(n_old))
    moved: dict[str, dict[str, Any]] = {}
    for old, values in overrides.items():
        if int(old) not in kept or not isinstance(values, dict):
            continue
        scaled = {}
        for name, v in values.items():
            was, now = before.get(name), after.get(name)
            if isinstance(v, int) and isinstance(was, int) and isinstance(now, int) and was > 0:
                v = max(1, round(v * now / was))
            scaled[name] = v
        moved[str(kept.index(int(old)))] = scaled
    after["per_layer_config"] = moved
    return True


def _fixed(cfg: Any, model_type: str) -> Any:
    """``cfg`` with the family's :data:`FIXES` applied."""
    parts = nested_configs(cfg)
    for key, value in FIXES.get(model_type, {}).items():
        if "." in key:  # a nested config the key is missing from
            owner, name = key.split(".", 1)
            _set(getattr(cfg, owner), name, value)
            continue
        having = [p for p in parts if key in vars(p)] or [cfg]
        for part in having:
            _set(part, key, value)
    return cfg
