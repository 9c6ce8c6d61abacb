"""What a model's own cache holds, layer by layer, read off the cache object it returned.

transformers hands a causal LM's cache back in its output (``lmprof.workloads.hf_interface``): a
``DynamicCache`` whose ``layers`` each hold keys and values (attention; a sliding-window layer keeps
its last ``window - 1`` tokens; multi-head latent attention caches its compressed latent), the
states of a linear-attention or state-space mixer (``conv_states``, ``recurrent_states``), or both
(a hybrid layer). Nothing here guesses from the config: the tensors are counted as the model made them.
"""
from __future__ import annotations

from typing import Any

import torch

from lmprof.estimate.facts import CacheLayer
from lmprof.workloads.hf_interface import state_tensors


def _numel(tensors: list[torch.Tensor], batch: int) -> int:
    """Elements per sequence."""
    return sum(t.numel() for t in tensors) // max(batch, 1)


def cache_layers(cache: Any, batch: int, tokens: int, layer_kinds: tuple[str, ...], latent: bool) -> list[CacheLayer]:
    """The cache's layers after ``tokens`` tokens of ``batch`` sequences, one sequence's share each.

    ``layer_kinds`` (the mixers of each layer, from the model) tells a linear-attention state from an
    SSM state; ``latent``: the model caches a compressed latent (multi-head latent attention).
    """
    out: list[CacheLayer] = []
    for i, layer in enumerate(getattr(cache, "layers", None) or []):
        fields = vars(layer)
        kv = [t for name in ("keys", "values") if isinstance(t := fields.get(name), torch.Tensor)]
        if kv:
            held = kv[0].shape[-2] if kv[0].dim() >= 2 else tokens
            per_token = _numel(kv, batch) // max(held, 1)
            window = fields.get("sliding_window")
            cap = int(window) - 1 if isinstance(window, int) and window > 1 else None
            if cap is None and held < tokens:  # a cache that stopped growing: it keeps what it holds
                cap = int(held)
            out.append(CacheLayer(i, "latent KV" if latent else "attention KV", _numel(kv, batch), tokens,
                                  per_token=per_token, window=cap))
        kind = layer_kinds[i] if i < len(layer_kinds) else ""
        state = "linear-attention state" if "linear attention" in kind else "SSM state"
        for name, what in (("conv_states", "conv state"), ("recurrent_states", state), ("ssm_states", state)):
            tensors = state_tensors(fields.get(name))
            if tensors:
                out.append(CacheLayer(i, what, _numel(tensors, batch), tokens))
    return out


def cache_storages(cache: Any) -> set[int]:
    """Storage ids of every tensor the cache holds (to tell its reads from other activations)."""
    ids: set[int] = set()
    for layer in getattr(cache, "layers", None) or []:
        for value in vars(layer).values():
            ids.update(int(t.untyped_storage()._cdata) for t in state_tensors(value))
    return ids
