"""One model description from any Hugging Face causal-LM config, and the shipped table of known models.

:func:`shape_from_config` reads a config.json dict (the keys Hugging Face writes) into a
:class:`~lmprof.estimate.shape.ModelShape`; :func:`resolve_model` accepts a table name
(``models.yaml`` beside this module), a config.json path or a model folder. Measured Hugging Face
runs build their shape through the same function (:func:`lmprof.workloads.hf.shape_of`), so the
analytic counts of a run and of ``lmprof roofline --model`` are the same formulas.

No torch import: this is data, read with pyyaml / json.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from lmprof import safejson
from lmprof.errors import ConfigError, DataError
from lmprof.estimate.dropout import Dropout, dropout_from_config
from lmprof.estimate.facts import SOURCE_NOTES, Source
from lmprof.estimate.families import Family, families
from lmprof.estimate.shape import Mlp, ModelShape, check_size

# model_type values lmprof's formulas describe (one record each, estimate/families.py), and those it
# knows it cannot (with the reason). BERT is not among them: transformers builds it as a causal LM
# (BertLMHeadModel), which the describer reads exactly, as `lmprof train --hf-config` runs it.
SUPPORTED = tuple(families())
_UNSUPPORTED_WHY = {
    "t5": "encoder-decoder models are not modelled",
}
# Keys a config of an unknown family must set for the generic (Llama-like) estimate.
GENERIC_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Where configs keep the routed experts and how many a token uses (the describer reads them too).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "top_k", "moe_top_k", "router_top_k")
# Fields that make a Llama-like guess wrong by far (the 13 of 18): experts, layers that mix
# tokens other than by attention, latent attention. A config with any of them never gets the guess.
_NOT_GENERIC: tuple[tuple[str, str], ...] = (
    (r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|n_shared_experts|"
     r"num_shared_experts|moe_intermediate_size|num_experts_per_tok)$", "expert"),
    (r"^(mamba_|ssm_|linear_|conv_L_cache|attn_layer_|hybrid_|layers_block_type|block_types?$|"
     r"hybrid_override_pattern|full_attn_idxs|short_conv)", "hybrid-layer"),
    (r"^(kv_lora_rank|q_lora_rank|qk_rope_head_dim)$", "latent-attention"),
)
_MIXING_LAYER_TYPES = ("linear_attention", "mamba", "conv", "ssm", "hybrid", "recurrent", "moe", "sparse")


@dataclass(frozen=True)
class ModelEntry:
    """A resolved model: its shape, where the config came from, and any published parameter counts.

    ``figures`` says where its figures come from: ``formula`` (``shape`` is lmprof's description of a
    family it knows), ``model`` (``shape`` is None: the describer reads ``config`` off the model,
    :mod:`lmprof.measure.model_facts`) or ``generic`` (``shape`` is a Llama-like guess, asked for).
    """

    name: str
    shape: ModelShape | None
    source: str  # where the config came from (a URL, a path)
    published_params: float | None = None
    published_active_params: float | None = None
    warning: str = ""  # set when the shape is a generic estimate of a family lmprof does not model
    published_tolerance: float = 0.01  # relative; wider where the entry's comment says why
    published_active_without_embedding: bool = False  # the authors' active count leaves the input embedding out
    dropout: Dropout = Dropout()  # what transformers would train it with (its config, else the defaults)
    figures: Source = "formula"
    config: dict[str, Any] | None = None  # the config.json, for the describer (figures "model")

    def active_params_as_published(self) -> int:
        """lmprof's active count under the authors' convention (without the input embedding where they say so)."""
        s = self.shape
        assert s is not None, "a formula entry"
        return s.n_params(active=True) - (s.vocab_size * s.n_embd if self.published_active_without_embedding else 0)

    @property
    def figures_note(self) -> str:
        return SOURCE_NOTES[self.figures]


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


# Which ModelShape size each Hugging Face key gives, so its range (shape.LIMITS) is checked under
# the name the user wrote.
_KEY_FIELD = {
    "num_hidden_layers": "n_layer", "n_layer": "n_layer", "num_attention_heads": "n_head", "n_head": "n_head",
    "hidden_size": "n_embd", "n_embd": "n_embd", "vocab_size": "vocab_size", "n_positions": "block_size",
    "max_position_embeddings": "block_size", "intermediate_size": "d_ff", "ffn_dim": "d_ff", "n_inner": "d_ff",
    "ffn_hidden_size": "d_ff", "num_key_value_heads": "n_kv_head", "num_kv_heads": "n_kv_head",
    "n_head_kv": "n_kv_head", "head_dim": "d_head", "num_local_experts": "n_experts", "num_experts": "n_experts",
    "num_experts_per_tok": "top_k", "moe_intermediate_size": "d_ff_expert",
    "shared_expert_intermediate_size": "d_ff_shared", "sliding_window": "sliding_window",
    "n_routed_experts": "n_experts", "intermediate_size_mlp": "d_ff", "first_k_dense_replace": "n_dense_layers",
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
    "qk_nope_head_dim": "d_head", "v_head_dim": "d_head_v", "attention_chunk_size": "sliding_window",
    "n_shared_experts": "n_shared_experts",
}


def check_config_sizes(cfg: Mapping[str, Any]) -> None:
    """ConfigError (one line) for a size the config sets outside what any published model has
    (``shape.LIMITS`` under the config's own key names), before anything is built from it: a hostile
    config of 10**6 layers is refused, not built module by module on the meta device."""
    for key, field in _KEY_FIELD.items():
        value = cfg.get(key)
        if value is None or (field == "sliding_window" and value == 0):
            continue
        for one in (value if isinstance(value, list) else [value]):  # per-layer lists (Gemma 3n) element by element
            check_size(field, one, f"config {key}")


def _checked(key: str, value: Any) -> int:
    return check_size(_KEY_FIELD[key], value, f"config {key}")


def _need(cfg: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            return _checked(key, cfg[key])
    raise ConfigError(f"{cfg.get('model_type')} config has no {keys[0]}")


def _opt(cfg: Mapping[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` the config sets, range-checked; None when none is set."""
    for key in keys:
        if cfg.get(key) is not None:
            return _checked(key, cfg[key])
    return None


def _act_mlp(act: str | None, gated: bool) -> Mlp:
    act = (act or "").lower()
    if gated:
        return "geglu" if act.startswith("gelu") else "swiglu"
    return "relu" if act == "relu" else "gelu"


def _sliding(cfg: Mapping[str, Any], n_layer: int, default_all: bool) -> tuple[int | None, int]:
    """(window, layers using it) from sliding_window / layer_types / use_sliding_window."""
    window = _opt(cfg, "sliding_window") if cfg.get("sliding_window") != 0 else None
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        layers = sum(1 for t in types if t == "sliding_attention")
        if not layers:  # every layer full: no window anywhere
            return None, 0
    elif cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern"):
        # Gemma 3: every pattern-th layer is global, the others slide.
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 1)
        layers = n_layer - n_layer // pattern
    else:
        layers = n_layer if default_all else n_layer // 2
    return int(window), layers


def shape_from_config(cfg: Mapping[str, Any], name: str = "") -> ModelShape:
    """The :class:`ModelShape` of a Hugging Face causal-LM config (a config.json as a dict).

    Raises :class:`ConfigError` naming the supported families for any other ``model_type``.
    """
    mt = str(cfg.get("model_type") or "")
    name = name or mt
    if mt in _UNSUPPORTED_WHY:
        raise ConfigError(f"unsupported architecture {mt!r}: {_UNSUPPORTED_WHY[mt]}; lmprof describes causal LMs "
                          "(every family transformers builds with AutoModelForCausalLM: docs/families.md)")
    if mt not in SUPPORTED:
        raise ConfigError(f"unsupported architecture {mt or '(no model_type)'!r}: lmprof describes "
                          f"{', '.join(SUPPORTED)}")
    rec = families()[mt]
    if rec.reader == "gpt2":
        d = _need(cfg, "n_embd")
        return ModelShape(
            n_layer=_need(cfg, "n_layer"), n_head=_need(cfg, "n_head"), n_embd=d,
            vocab_size=_need(cfg, "vocab_size"), block_size=_need(cfg, "n_positions"),
            d_ff=_opt(cfg, "n_inner") or 4 * d, bias=True, tied=bool(cfg.get("tie_word_embeddings", True)),
            name=name, family=mt,
        )
    if rec.reader == "gpt_neox":
        return ModelShape(
            n_layer=_need(cfg, "num_hidden_layers"), n_head=_need(cfg, "num_attention_heads"),
            n_embd=_need(cfg, "hidden_size"), vocab_size=_need(cfg, "vocab_size"),
            block_size=_need(cfg, "max_position_embeddings"), d_ff=_need(cfg, "intermediate_size"),
            mlp=_act_mlp(cfg.get("hidden_act", "gelu"), False),
            pos="rope", bias=bool(cfg.get("attention_bias", True)), norm_bias=True,
            parallel=bool(cfg.get("use_parallel_residual", True)),
            tied=bool(cfg.get("tie_word_embeddings", False)), name=name, family=mt,
        )
    if rec.reader == "opt":
        d = _need(cfg, "hidden_size")
        if cfg.get("word_embed_proj_dim", d) != d or cfg.get("do_layer_norm_before", True) is False:
            raise ConfigError("unsupported OPT variant: word_embed_proj_dim != hidden_size (opt-350m) is not modelled")
        return ModelShape(
            n_layer=_need(cfg, "num_hidden_layers"), n_head=_need(cfg, "num_attention_heads"), n_embd=d,
            vocab_size=_need(cfg, "vocab_size"), block_size=_need(cfg, "max_position_embeddings"),
            d_ff=_need(cfg, "ffn_dim"), mlp=_act_mlp(cfg.get("activation_function", "relu"), False),
            bias=bool(cfg.get("enable_bias", True)), norm_bias=True, pos_offset=2,
            tied=bool(cfg.get("tie_word_embeddings", True)), name=name, family=mt,
        )
    if rec.reader == "falcon":
        d = _need(cfg, "hidden_size")
        n_head = _need(cfg, "num_attention_heads", "n_head")
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        if new_arch:
            kv = _opt(cfg, "num_kv_heads", "n_head_kv") or n_head
        else:
            kv = 1 if cfg.get("multi_query", True) else n_head
        parallel = bool(cfg.get("parallel_attn", True)) or new_arch
        norms = 2 if (new_arch and cfg.get("num_ln_in_parallel_attn", 2) == 2) or not parallel else 1
        return ModelShape(
            n_layer=_need(cfg, "num_hidden_layers", "n_layer"), n_head=n_head, n_embd=d, n_kv_head=kv,
            vocab_size=_need(cfg, "vocab_size"), block_size=int(cfg.get("max_position_embeddings") or 2048),
            d_ff=_opt(cfg, "ffn_hidden_size") or 4 * d, mlp="gelu", pos="rope", bias=bool(cfg.get("bias", False)),
            norm_bias=True, parallel=parallel, norms_per_layer=norms,
            # transformers' Falcon broadcasts grouped K and V to every head before caching them
            kv_cache_repeated=new_arch and kv < n_head,
            tied=bool(cfg.get("tie_word_embeddings", True)), name=name, family=mt,
        )
    if rec.reader == "gpt_bigcode":
        d = _need(cfg, "n_embd")
        n_head = _need(cfg, "n_head")
        return ModelShape(
            n_layer=_need(cfg, "n_layer"), n_head=n_head, n_kv_head=1 if cfg.get("multi_query", True) else n_head,
            n_embd=d, vocab_size=_need(cfg, "vocab_size"), block_size=_need(cfg, "n_positions"),
            d_ff=_opt(cfg, "n_inner") or 4 * d, bias=True, tied=bool(cfg.get("tie_word_embeddings", True)),
            name=name, family=mt,
        )
    if rec.reader == "phi":
        # Parallel attention + MLP behind one LayerNorm; biases everywhere, the lm_head's included.
        n_head = _need(cfg, "num_attention_heads")
        return ModelShape(
            n_layer=_need(cfg, "num_hidden_layers"), n_head=n_head, n_embd=_need(cfg, "hidden_size"),
            n_kv_head=_opt(cfg, "num_key_value_heads") or n_head, vocab_size=_need(cfg, "vocab_size"),
            block_size=_need(cfg, "max_position_embeddings"), d_ff=_need(cfg, "intermediate_size"),
            mlp=_act_mlp(cfg.get("hidden_act", "gelu_new"), False), pos="rope", bias=True, parallel=True,
            norms_per_layer=1, head_bias=True, qk_norm="head" if cfg.get("qk_layernorm") else "",
            tied=bool(cfg.get("tie_word_embeddings", False)), name=name, family=mt,
        )
    if rec.reader == "deepseek":
        return _deepseek(cfg, rec, name)
    return _llama_like(cfg, rec, name)


def _dense_layer_count(cfg: Mapping[str, Any], rec: Family, n_layer: int) -> int:
    """Layers of an MoE model whose MLP is dense, by the family's own rule (its record's ``dense``)."""
    if rec.dense == "qwen":
        only = cfg.get("mlp_only_layers") or []
        step = int(cfg.get("decoder_sparse_step") or 1)
        return sum(1 for i in range(n_layer) if i in only or (i + 1) % step)
    if rec.dense == "llama4":
        moe_layers = cfg.get("moe_layers")
        if isinstance(moe_layers, list):
            return n_layer - len(moe_layers)
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        return n_layer - len(range(step - 1, n_layer, step))
    if rec.dense == "first_k":
        return min(n_layer, _opt(cfg, "first_k_dense_replace") or 0)
    return 0


def _llama_like(cfg: Mapping[str, Any], rec: Family, name: str) -> ModelShape:
    """A Llama layer (RMSNorm, rotary, gated MLP) with the family's differences, read off its record:
    default tie and attention bias, o_proj's bias, q/k/v bias, norms per layer, QK-norm, where a window
    slides, and how the config names its experts and dense layers."""
    mt = rec.name
    n_layer = _need(cfg, "num_hidden_layers")
    n_head = _need(cfg, "num_attention_heads")
    d = _need(cfg, "hidden_size")
    head_dim = _opt(cfg, "head_dim")
    window, sliding = _sliding(cfg, n_layer, default_all=rec.sliding == "all")
    if rec.experts == "llama4" and cfg.get("attention_chunk_size"):
        # Chunked attention attends within a fixed chunk: counted as a window of that size.
        types = cfg.get("layer_types")
        window = _opt(cfg, "attention_chunk_size")
        sliding = (sum(1 for t in types if t == "chunked_attention") if isinstance(types, list)
                   else n_layer - n_layer // int(cfg.get("no_rope_layer_interval") or 4))
    attention_bias = bool(cfg.get("attention_bias", rec.attention_bias))
    kw: dict[str, Any] = dict(
        n_layer=n_layer, n_head=n_head, n_embd=d, vocab_size=_need(cfg, "vocab_size"),
        block_size=_need(cfg, "max_position_embeddings"),
        n_kv_head=_opt(cfg, "num_key_value_heads") or n_head, d_ff=_need(cfg, "intermediate_size"),
        mlp=_act_mlp(_get(cfg, "hidden_activation", "hidden_act", default="silu"), True), norm="rmsnorm",
        pos="rope", bias=bool(cfg.get("mlp_bias", False)), qkv_bias=attention_bias or rec.qkv_bias,
        tied=bool(cfg.get("tie_word_embeddings", rec.tied)),
        d_head=head_dim if head_dim and head_dim * n_head != d else None, sliding_window=window,
        sliding_layers=sliding if window else 0, name=name, family=mt, norms_per_layer=rec.norms,
        o_bias=attention_bias if rec.o_bias else None,
    )
    if rec.qk_norm in ("head", "full"):
        kw["qk_norm"] = rec.qk_norm
    elif rec.qk_norm == "use_qk_norm" and cfg.get("use_qk_norm"):
        kw["qk_norm"] = "head"
    if rec.experts == "mixtral":
        kw.update(n_experts=_need(cfg, "num_local_experts"), top_k=_need(cfg, "num_experts_per_tok"))
    if rec.experts == "qwen":
        # 0 is how a config says "no shared expert".
        shared = _opt(cfg, "shared_expert_intermediate_size") if cfg.get("shared_expert_intermediate_size") else 0
        kw.update(n_experts=_need(cfg, "num_experts", "num_local_experts"), top_k=_need(cfg, "num_experts_per_tok"),
                  d_ff_expert=_need(cfg, "moe_intermediate_size"), n_shared_experts=1 if shared else 0,
                  d_ff_shared=shared or None, shared_expert_gate=bool(shared))
    if rec.experts == "gpt_oss":
        # Experts with biases (gate_up and down), a router with a bias, a sink logit per head, o_proj bias.
        kw.update(n_experts=_need(cfg, "num_local_experts"), top_k=_need(cfg, "num_experts_per_tok"), bias=True,
                  o_bias=attention_bias, router_bias=True, attn_sinks=True)
    if rec.experts == "llama4":
        # MoE layers: routed experts and one shared expert of intermediate_size; dense layers: intermediate_size_mlp.
        f = _need(cfg, "intermediate_size")
        kw.update(n_experts=_need(cfg, "num_local_experts"), top_k=_need(cfg, "num_experts_per_tok"),
                  d_ff=_opt(cfg, "intermediate_size_mlp") or f, d_ff_expert=f, n_shared_experts=1, d_ff_shared=f)
    if rec.experts == "routed":
        kw.update(_routed_experts(cfg), o_bias=False)
    if kw.get("n_experts"):
        kw["n_dense_layers"] = _dense_layer_count(cfg, rec, n_layer)
    return ModelShape(**kw)


def _routed_experts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-style MoE (DeepSeek-V3, GLM-4.5): routed experts, shared experts of the same width."""
    fe = _need(cfg, "moe_intermediate_size")
    shared = _opt(cfg, "n_shared_experts") or 0
    return dict(n_experts=_need(cfg, "n_routed_experts"), top_k=_need(cfg, "num_experts_per_tok"), d_ff_expert=fe,
                n_shared_experts=shared, d_ff_shared=fe if shared else None)


def _deepseek(cfg: Mapping[str, Any], rec: Family, name: str) -> ModelShape:
    """DeepSeek-V2 / V3: multi-head latent attention, dense-first layers, routed + shared experts."""
    mt = rec.name
    if cfg.get("attention_bias"):
        raise ConfigError(f"{mt} configs with attention_bias are not modelled")
    if int(cfg.get("moe_layer_freq") or 1) != 1:
        raise ConfigError(f"{mt} configs with moe_layer_freq != 1 are not modelled")
    n_layer = _need(cfg, "num_hidden_layers")
    n_head = _need(cfg, "num_attention_heads")
    rope = _need(cfg, "qk_rope_head_dim")
    kw: dict[str, Any] = dict(
        n_layer=n_layer, n_head=n_head, n_kv_head=n_head, n_embd=_need(cfg, "hidden_size"),
        vocab_size=_need(cfg, "vocab_size"), block_size=_need(cfg, "max_position_embeddings"),
        d_ff=_need(cfg, "intermediate_size"), mlp="swiglu", norm="rmsnorm", pos="rope", bias=False,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        d_head=_need(cfg, "qk_nope_head_dim") + rope, d_head_v=_need(cfg, "v_head_dim"),
        q_lora_rank=_opt(cfg, "q_lora_rank"), kv_lora_rank=_need(cfg, "kv_lora_rank"), qk_rope_head_dim=rope,
        name=name, family=mt, **_routed_experts(cfg),
    )
    kw["n_dense_layers"] = _dense_layer_count(cfg, rec, n_layer)
    return ModelShape(**kw)


def generic_shape(cfg: Mapping[str, Any], name: str = "") -> ModelShape:
    """A Llama-like estimate of an unknown family from the config's generic keys (GENERIC_KEYS).

    ConfigError naming the missing keys when the config does not set them. Callers state that the
    figures are an estimate of a layout lmprof has not checked against the model.
    """
    missing = [k for k in GENERIC_KEYS if cfg.get(k) is None]
    mt = str(cfg.get("model_type") or "(no model_type)")
    if missing:
        raise ConfigError(f"unsupported architecture {mt!r}: lmprof describes {', '.join(SUPPORTED)}; a generic "
                          f"estimate needs {', '.join(missing)}")
    shape = _llama_like({**cfg, "max_position_embeddings": cfg.get("max_position_embeddings") or 4096},
                        families()["llama"], name or mt)
    return replace(shape, family=mt)


def generic_refusal(cfg: Mapping[str, Any]) -> str | None:
    """Why a Llama-like guess would be wrong for ``cfg`` (its expert, hybrid-layer or latent-attention
    fields), or None when the config has none of them."""
    import re

    for key, value in cfg.items():
        if value in (None, 0, False, [], ""):
            continue
        for rx, what in _NOT_GENERIC:
            if re.search(rx, str(key)):
                return f"it has {what} fields ({key})"
    types = cfg.get("layer_types") or cfg.get("mlp_layer_types")
    if isinstance(types, list) and any(any(k in str(t) for k in _MIXING_LAYER_TYPES) for t in types):
        return "it has hybrid-layer fields (layer_types)"
    return None


def generic_entry(entry: ModelEntry, why: str = "") -> ModelEntry:
    """``entry`` (a family lmprof has no formulas for) as a generic Llama-like guess, marked ``generic``.

    ConfigError when its config has expert, hybrid-layer or latent-attention fields (a guess would be
    wrong by far) or lacks the generic keys. ``why``: what kept the describer from reading the model.
    """
    cfg = entry.config or {}
    mt = str(cfg.get("model_type") or "(no model_type)")
    refusal = generic_refusal(cfg)
    if refusal:
        raise ConfigError(f"no generic guess for {mt!r}: {refusal}, which a Llama-like guess cannot describe"
                          + (f" ({why})" if why else ""))
    shape = generic_shape(cfg, name=entry.name)
    return replace(entry, shape=shape, figures="generic", warning=(
        f"{mt!r} figures are a GENERIC Llama-like guess from {', '.join(GENERIC_KEYS)} (RMSNorm, gated MLP, no "
        "experts), asked for with --allow-generic" + (f"; the describer could not read the model: {why}" if why
        else "") + "; check them before relying on them"))


def config_positions(cfg: Mapping[str, Any], default: int = 4096) -> int:
    """The longest sequence a config allows (its max_position_embeddings or kin), else ``default``."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


# -- the shipped table ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    path = Path(str(resources.files("lmprof.estimate").joinpath("models.yaml")))
    return dict(yaml.safe_load(path.read_text())["models"])


@lru_cache(maxsize=1)
def family_table() -> dict[str, dict[str, Any]]:
    """Each supported family: its example table entry and the config.json keys lmprof reads (``llama-like`` expanded)."""
    return {name: {"example": rec.example, "reads": list(rec.reads), "ignored": list(rec.ignored)}
            for name, rec in families().items()}


def known_models() -> list[str]:
    """Names of the shipped table, in file order."""
    return list(_table())


def known_config(name: str) -> dict[str, Any]:
    """The Hugging Face config dict of a table entry (a copy)."""
    return dict(_table()[name]["config"])


# Sizes of the shrunk instances used to check the analytic model against transformers' own models.
_SHRINK = dict(hidden_size=64, n_embd=64, intermediate_size=96, ffn_dim=96, num_hidden_layers=2, n_layer=2,
               vocab_size=128, max_position_embeddings=64, n_positions=64, moe_intermediate_size=32,
               shared_expert_intermediate_size=48, num_attention_heads=4, n_head=4, num_kv_heads=2, head_dim=32,
               num_experts=6)


def shrunk_config(name: str) -> dict[str, Any]:
    """A table entry's config with every size shrunk (width 64, 2 layers, 4 heads, vocabulary 128).

    The layout is kept: grouped-query attention stays grouped, multi-query stays multi-query, a head
    size set apart stays set apart, experts stay experts. Special token ids are set inside the small
    vocabulary. Used to build random-weight instances with transformers in tests and benchmarks.
    """
    full = known_config(name)
    cfg = {k: (_SHRINK[k] if k in _SHRINK else v) for k, v in full.items()}
    if "num_key_value_heads" in full:
        cfg["num_key_value_heads"] = 2 if full["num_key_value_heads"] < full["num_attention_heads"] else 4
    if cfg.get("sliding_window"):
        cfg["sliding_window"] = 48
    if "word_embed_proj_dim" in cfg:
        cfg["word_embed_proj_dim"] = cfg["hidden_size"]
    cfg.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return cfg


def _norm_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").split("/")[-1].removesuffix("-hf")


def read_config(path: Path) -> dict[str, Any]:
    """A config.json (or a folder holding one) as a dict; DataError when missing or not JSON."""
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"no config.json at {path}")
    data = safejson.load_file(file)  # one line naming the file: unreadable, not JSON, nested too deeply
    if not isinstance(data, dict):
        raise DataError(f"{file} is not a JSON object")
    return data


def resolve_model(spec: str) -> ModelEntry:
    """A table name (case-insensitive, ``-hf`` and org prefixes ignored), a config.json or a model folder."""
    text = (spec or "").strip()
    if not text:
        raise ConfigError("--model is empty: give a name (see `lmprof roofline --list-models`) or a config.json path")
    path = Path(text).expanduser()
    looks_like_path = path.suffix == ".json" or "/" in text or "\\" in text
    if path.exists() or (looks_like_path and _norm_name(text) not in _table()):
        cfg = read_config(path)
        label = path.name if path.is_dir() else path.parent.name or path.stem
        return _entry(cfg, label, text, str(path))
    table = _table()
    key = _norm_name(text)
    if key not in table:
        raise ConfigError(f"unknown model {spec!r}: use a config.json path, a model folder, or one of "
                          f"{', '.join(table)}")
    e = table[key]
    return replace(_entry(dict(e["config"]), key, key, str(e["source"])),
                   published_params=_float(e.get("published_params")),
                   published_active_params=_float(e.get("published_active_params")),
                   published_tolerance=float(e.get("published_tolerance", 0.01)),
                   published_active_without_embedding=bool(e.get("published_active_without_embedding", False)))


def _entry(cfg: dict[str, Any], label: str, name: str, where: str) -> ModelEntry:
    """A config's entry: lmprof's formulas for a family they know, else the describer's (``figures="model"``)."""
    mt = str(cfg.get("model_type") or "")
    if mt in SUPPORTED or mt in _UNSUPPORTED_WHY:
        return ModelEntry(name=label, shape=shape_from_config(cfg, name=name), source=where,
                          dropout=dropout_from_config(cfg), config=cfg)
    if not mt:
        raise ConfigError(f"{where} has no model_type: lmprof cannot tell which model it describes")
    return ModelEntry(name=label, shape=None, source=where, dropout=dropout_from_config(cfg), figures="model",
                      config=cfg)


def _float(value: Any) -> float | None:
    # YAML 1.1 reads 8.03e9 (no sign in the exponent) as a string.
    return None if value is None else float(value)
