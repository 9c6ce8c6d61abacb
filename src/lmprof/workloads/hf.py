"""Hugging Face causal LMs: load from a local path or the local hub cache, or build from a config.

transformers is an optional extra (``pip install lmprof[hf]``). Nothing here downloads unless the
user passes ``download=True``: an uncached hub id is a clear error, never a hang on a dead network.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmprof import safejson
from lmprof.errors import ConfigError, DataError, LmprofError, first_line
from lmprof.estimate.models import known_config, known_models
from lmprof.estimate.shape import ModelShape

if TYPE_CHECKING:  # transformers is optional: imported where a model is built, named here for the checker
    from transformers import PretrainedConfig

# Architectures users name with --hf-config, built with random weights and no download: the published
# models of the model table (estimate/models.yaml: gpt2, llama-2-7b, mistral-7b, ...) and these, which
# are not published figures the table checks. (model_type, config kwargs).
KNOWN_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-gpt2": ("gpt2", {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 128, "vocab_size": 1000,
                           "bos_token_id": 999, "eos_token_id": 999}),
    "tinyllama-1.1b": ("llama", {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                                 "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
                                 "max_position_embeddings": 2048}),
    "tiny-llama": ("llama", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                             "max_position_embeddings": 256}),
}


@dataclass
class HFModel:
    model: torch.nn.Module
    tokenizer: Any | None
    name: str
    source: str  # "local path", "hub cache", "config (random weights)"

    @property
    def config(self) -> PretrainedConfig:
        """The model's transformers config (its vocab_size, model_type, ...)."""
        from transformers import PretrainedConfig

        cfg = self.model.config
        assert isinstance(cfg, PretrainedConfig)  # every transformers model built or loaded here holds one
        return cfg


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise LmprofError("Hugging Face models need transformers: pip install 'lmprof[hf]'") from None
    transformers.logging.set_verbosity(logging.ERROR)  # config warnings would bury the summary
    return transformers


def _dtype_kw(tf: Any, dtype: torch.dtype) -> dict[str, Any]:
    # transformers renamed torch_dtype to dtype (4.56); accept both versions.
    major, minor = (int(x) for x in tf.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def refusals(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What transformers raises for a config or folder it refuses (read as the user's input, one line):
    ValueError and kin, and since transformers 5 the strict-dataclass validation errors of
    huggingface_hub, which derive from Exception alone (ZAYA's "supports num_experts_per_tok=1 only")."""
    found: list[type[BaseException]] = [ValueError, KeyError, TypeError, AttributeError, AssertionError, *more]
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub validates nothing of its own
        pass
    else:
        found.append(StrictDataclassError)
    return tuple(found)


def config_for(name: str, **overrides: Any) -> Any:
    """A transformers config for a known architecture name or a local config.json."""
    tf = _transformers()
    path = Path(name)
    if path.suffix == ".json" or path.is_dir():
        if not path.exists():
            raise DataError(f"config not found: {path}")
        # read by lmprof's bounded reader first: transformers' own parser recurses on deep nesting
        safejson.load_file(path / "config.json" if path.is_dir() else path)
        try:
            cfg = tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except refusals(OSError) as exc:  # truncated JSON, unknown model_type, values it validates away
            raise DataError(f"cannot read the Hugging Face config {path}: {first_line(exc, 300)}") from None
    elif name in KNOWN_CONFIGS:
        model_type, kw = KNOWN_CONFIGS[name]
        cfg = tf.AutoConfig.for_model(model_type, **kw)
    elif name in known_models():  # the shipped model table (lmprof roofline / memory --model)
        kw = known_config(name)
        cfg = tf.AutoConfig.for_model(kw.pop("model_type"), **kw)
    else:
        raise ConfigError(f"unknown --hf-config {name!r}: use one of {', '.join([*KNOWN_CONFIGS, *known_models()])} "
                          "or a config.json path")
    for k, v in overrides.items():
        if v is not None:
            try:
                setattr(cfg, k, v)
            except refusals() as exc:  # a strict config validates each value set
                raise ConfigError(f"this {getattr(cfg, 'model_type', '')} config refuses {k}={v!r}: "
                                  f"{first_line(exc, 300)}") from None
    layers = overrides.get("num_hidden_layers")
    if layers is not None:
        # Per-layer lists (attention type per layer) must shrink or grow with the layer count.
        kinds = getattr(cfg, "layer_types", None)
        if isinstance(kinds, list) and kinds:
            cfg.layer_types = (kinds * (layers // len(kinds) + 1))[:layers]
        if getattr(cfg, "max_window_layers", None) is not None:
            cfg.max_window_layers = min(cfg.max_window_layers, layers)
    return cfg


def from_config(name: str, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> HFModel:
    """Build a model from an architecture with random weights (no download)."""
    tf = _transformers()
    cfg = config_for(name, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, **_dtype_kw(tf, dtype))
    return HFModel(model, None, name, "config (random weights)")


def load(name_or_path: str, dtype: torch.dtype = torch.float32, download: bool = False) -> HFModel:
    """Load weights (and tokenizer when present) from a local folder or the local hub cache."""
    tf = _transformers()
    path = Path(name_or_path)
    local = path.exists()
    if local and not (path / "config.json").is_file():
        raise DataError(f"{path} is not a Hugging Face model folder (no config.json)")
    if local:
        safejson.load_file(path / "config.json")  # bounded, before transformers' recursive parser
    if not local and not download:
        # Never touch the network at run time unless asked: the hub client can wait a long time.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        with warnings.catch_warnings():  # torch's note on the pickle protocol would precede our one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            model = tf.AutoModelForCausalLM.from_pretrained(
                name_or_path, local_files_only=not download, **_dtype_kw(tf, dtype)
            )
    except pickle.UnpicklingError:
        # torch.load(weights_only=True) refused a weights file holding more than tensors: nothing ran.
        raise DataError(f"cannot load a causal LM from {path}: its weights file holds Python objects, not only "
                        "tensors, and lmprof never unpickles those (nothing was executed); use safetensors "
                        "weights") from None
    except refusals(OSError, EOFError) as exc:
        # a cached hub model that is there but refused is the folder's problem, like a local one's
        if local or not isinstance(exc, (OSError, ValueError, KeyError, EOFError)):
            raise DataError(f"cannot load a causal LM from {name_or_path}: {first_line(exc, 300)}") from None
        raise DataError(
            f"model {name_or_path!r} is not in the local Hugging Face cache (offline); "
            "pass a local folder, --download to fetch it, or --hf-config for random weights"
        ) from None
    tokenizer = None
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(name_or_path, local_files_only=not download)
    except Exception:  # noqa: BLE001 - a model without tokenizer files is still profilable
        tokenizer = None
    return HFModel(model, tokenizer, name_or_path, "local path" if local else "hub cache")


def shape_of(model: torch.nn.Module) -> ModelShape | None:
    """ModelShape of a Hugging Face causal LM from its config (every family lmprof describes), else None.

    The same description ``lmprof roofline --model`` and ``lmprof memory --model`` use
    (:func:`lmprof.estimate.models.shape_from_config`).
    """
    from lmprof.estimate.models import shape_from_config

    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return None
    data = cfg.to_dict()
    try:
        return shape_from_config(data, name=str(data.get("model_type") or ""))
    except ConfigError:
        return None


def config_dict(model: torch.nn.Module | None) -> dict[str, Any] | None:
    """A Hugging Face model's config as a config.json dict (under compile / DDP wrappers), None for other models."""
    for attr in ("_orig_mod", "module"):
        inner = getattr(model, attr, None)
        if isinstance(inner, torch.nn.Module):
            model = inner
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict") or not getattr(cfg, "model_type", None):
        return None
    data = cfg.to_dict()
    return data if isinstance(data, dict) else None


def nested_configs(cfg: Any, seen: set[int] | None = None) -> list[Any]:
    """``cfg`` (a transformers config) and every config nested in it (text, vision, audio, decoder
    parts), each once."""
    tf = _transformers()
    seen = seen if seen is not None else set()
    if id(cfg) in seen:
        return []
    seen.add(id(cfg))
    out = [cfg]
    for value in list(vars(cfg).values()):
        if isinstance(value, tf.PretrainedConfig):
            out += nested_configs(value, seen)
    return out


def _text_config(model: torch.nn.Module) -> Any:
    """The config of the model's language part: the config itself, or a multimodal config's text config."""
    cfg = getattr(model, "config", None)
    get = getattr(cfg, "get_text_config", None)
    if callable(get):
        try:
            return get()
        except Exception:  # noqa: BLE001 - a family's own config code; the config itself then
            return cfg
    return cfg


def token_space(model: torch.nn.Module) -> tuple[int, frozenset[int]]:
    """How many token ids the model takes and predicts (the fewer of its input embedding's rows and
    its output layer's classes, else its text config's ``vocab_size``) and its special ids: every
    ``*_token_id`` / ``*_token_index`` of its config and the configs nested in it (bos, eos, pad, a
    multimodal model's image and audio tokens). ConfigError when neither tells the vocabulary."""
    sizes = []
    with contextlib.suppress(Exception):  # not every module implements them
        emb = model.get_input_embeddings()  # type: ignore[operator]  # transformers' PreTrainedModel method
        if isinstance(emb, torch.nn.Embedding):
            sizes.append(emb.num_embeddings)
        head = model.get_output_embeddings()  # type: ignore[operator]
        if isinstance(head, torch.nn.Linear):
            sizes.append(head.out_features)  # the labels are the inputs: Moshi embeds 129 ids, predicts 128
    v = getattr(_text_config(model), "vocab_size", None)
    if not sizes and isinstance(v, int) and not isinstance(v, bool):
        sizes.append(v)
    vocab = min(sizes) if sizes else None
    if vocab is None:
        raise ConfigError(f"cannot tell how many token ids {type(model).__name__} takes (no input embedding, no "
                          "vocab_size in its config)")
    special: set[int] = set()
    config = getattr(model, "config", None)
    for cfg in nested_configs(config) if config is not None else []:
        for key, value in vars(cfg).items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(v, int) and not isinstance(v, bool):
                        special.add(v)
    return vocab, frozenset(i for i in special if 0 <= i < vocab)


def context_length(model: torch.nn.Module) -> int | None:
    """The longest sequence the model's config allows; None when it names no limit (XLNet's -1: relative
    positions, no table to run past)."""
    cfg = _text_config(model)
    for key in ("n_positions", "max_position_embeddings"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v if v > 0 else None
    return None
