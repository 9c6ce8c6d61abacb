"""What lmprof reads of a transformers model, in one place, through transformers' own interfaces.

The KV cache as transformers itself hands it out, never found by parameter names.

A causal LM called with ``use_cache=True`` returns its cache in its output object; the output field
that holds it (``past_key_values`` up to transformers 5.23, ``cache`` from 5.24) is also the keyword
that feeds it back. So lmprof reads the name from what the model returned instead of from
``forward``'s signature, which broke silently when transformers renamed the argument.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from lmprof.errors import ConfigError
from lmprof.estimate.dropout import Dropout, dropout_from_config

# Where transformers put a cache before its Cache classes were the default (tuples of tensors).
_LEGACY_FIELD = "past_key_values"


def is_generation_model(model: torch.nn.Module) -> bool:
    """True for a transformers model that can generate (``GenerationMixin``): it must have a KV cache."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    return isinstance(model, GenerationMixin)


def _is_cache(value: Any) -> bool:
    try:
        from transformers import Cache
    except ImportError:  # pragma: no cover - only called on transformers models
        return False
    return isinstance(value, Cache)


def forward_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[int, int] | None]:
    """What a causal LM's forward was called on: its batch (the token ids, else ``inputs_embeds``, else the
    first argument) and the (batch, sequence) of its tokens where that shows (None otherwise)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None and isinstance(kwargs.get("inputs_embeds"), torch.Tensor):
        ids = kwargs["inputs_embeds"]
        return ids, (int(ids.shape[0]), int(ids.shape[1])) if ids.dim() == 3 else None
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
        return ids, (int(ids.shape[0]), int(ids.shape[1]))
    return ids, None


def returned_cache(output: Any) -> tuple[str, Any] | None:
    """``(field, cache)``: the KV cache in a transformers output and the keyword that feeds it back.

    The field holding a ``transformers.Cache``; for older transformers that return tuples of
    tensors, the ``past_key_values`` field. None when the output holds no cache.
    """
    items = list(output.items()) if hasattr(output, "items") else []
    for name, value in items:
        if _is_cache(value):
            return str(name), value
    legacy = dict(items).get(_LEGACY_FIELD)
    if isinstance(legacy, (tuple, list)) and legacy:
        return _LEGACY_FIELD, legacy
    return None


def require_cache(model: torch.nn.Module, output: Any) -> tuple[str, Any]:
    """:func:`returned_cache`, or one clear error: a model that generates must hand back its cache."""
    found = returned_cache(output)
    if found is None:
        raise ConfigError(
            f"{type(model).__name__} returned no KV cache when called with use_cache=True, so lmprof cannot "
            "drive its cache (transformers "
            f"{_transformers_version()}); measure without one with --no-kv-cache, or report this model")
    return found


def cache_keyword(model: torch.nn.Module, device: torch.device) -> str:
    """The keyword that feeds a cache back into ``model``: read from a one-token call's output."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    with torch.no_grad():
        return require_cache(model, model(input_ids=ids, use_cache=True))[0]


def wants_whole_sequence(model: torch.nn.Module, ids: torch.Tensor, cache: dict[str, Any]) -> bool:
    """True when ``model`` takes every token so far at each decode step, not only the new one.

    Asked of the model's own ``prepare_inputs_for_generation``, as transformers' ``generate()`` asks
    it: with the cache and the sequence so far (``ids``, the new token last) and one new token
    announced, does it keep the whole sequence? CPM-Ant does (its forward slices the cached prefix
    off itself, and fails when given one token). False where the method cannot say (transformers
    before ``next_sequence_length``, or a model whose method fails without its other inputs): the
    new token alone, as almost every model takes it.
    """
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    try:
        if prepare is None or "next_sequence_length" not in inspect.signature(prepare).parameters:
            return False
        with torch.no_grad():
            inputs = prepare(ids, next_sequence_length=1, use_cache=True, **cache)
    except Exception:  # noqa: BLE001 - a model's own helper, called outside generate(): no answer
        return False
    given = inputs.get("input_ids") if isinstance(inputs, dict) else None
    return isinstance(given, torch.Tensor) and given.shape[-1] == ids.shape[-1] > 1


# What a cache layer holds besides keys and values: the states of linear-attention and state-space
# mixers (transformers >= 5 keeps them per layer, as dicts of tensors).
STATE_FIELDS = ("conv_states", "recurrent_states", "ssm_states")


def state_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a cache field: a tensor, or a dict / list of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in state_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in state_tensors(v)]
    return []


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor a cache holds: keys and values, and the states of linear-attention and SSM layers
    (Cache objects of any transformers version, or tuples)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56: a list of per-layer caches
        return [t for layer in layers for name in ("keys", "values", *STATE_FIELDS)
                for t in state_tensors(getattr(layer, name, None))]
    if hasattr(cache, "key_cache"):  # transformers 4.36 - 4.55
        return [*cache.key_cache, *cache.value_cache]
    if isinstance(cache, (tuple, list)):
        return [t for layer in cache for t in layer if isinstance(t, torch.Tensor)]
    return []


def cache_bytes(cache: Any) -> int:
    """Bytes of every key and value tensor a cache holds."""
    return sum(t.numel() * t.element_size() for t in cache_tensors(cache))


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The attention kernel transformers chose for ``model`` (``sdpa``, ``eager``, ...), None if not a
    transformers model. ``config._attn_implementation`` is where transformers itself keeps the choice
    (``set_attn_implementation`` writes it); there is no public reader."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def training_dropout(model: torch.nn.Module) -> Dropout:
    """The dropout rates ``model`` applies in train mode, by site, from its config (none if not a transformers
    model). Attention dropout also decides the SDPA kernel: on the CPU it runs the math kernel."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return Dropout()
    return dropout_from_config(cfg.to_dict())


def generate_compiles(model: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether transformers' ``generate()`` (called with ``kwargs``) compiles the model's whole call for its
    decode steps, or did already: a static cache on a device it compiles on (CUDA, XPU, ...) or with a
    compile config that asks for every device, unless ``disable_compile``. A hook on the model, or inside
    it, is then inside compiled code, and placing or removing one makes dynamo compile again."""
    if getattr(model, "_compiled_call", None) is not None:
        return True
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)

    def said(name: str) -> Any:
        return kwargs.get(name, getattr(config, name, None))

    if said("disable_compile"):
        return False
    try:  # transformers' own list of the caches its generate() may compile
        from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS as static
    except ImportError:
        static = ("static", "offloaded_static")
    cache = kwargs.get("past_key_values")
    compilable = said("cache_implementation") in static or (
        cache is not None and bool(getattr(cache, "is_compileable", False)) and type(cache).__name__ != "DynamicCache")
    device = getattr(getattr(model, "device", None), "type", "cpu")
    every_device = bool(getattr(said("compile_config"), "_compile_all_devices", False))
    return compilable and (device in ("cuda", "xpu", "neuron", "tpu") or every_device)


def supports_static_cache(model: torch.nn.Module) -> bool:
    """True when transformers marks ``model`` as compilable whole with a ``StaticCache``."""
    return bool(getattr(model, "_can_compile_fullgraph", False))


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:  # pragma: no cover
        return "not installed"
    return str(transformers.__version__)
