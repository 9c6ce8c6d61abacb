"""Greedy decoding behind one small interface, for the built-in GPT, Hugging Face LMs and any module.

A :class:`Decoder` runs the prefill (the whole prompt) and then one decode step per new token. With
the KV cache off, every decode step re-runs the whole sequence (the quadratic baseline).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from lmprof.errors import ConfigError
from lmprof.workloads.gpt import GPT, KVCache
from lmprof.workloads.hf_interface import (
    cache_bytes, cache_keyword, is_generation_model, require_cache, supports_static_cache, wants_whole_sequence,
)


class Decoder:
    """Prefill then token-by-token decode; subclasses know the model's calling convention."""

    kv_cache: bool = False

    def start(self, prompt: torch.Tensor, max_len: int) -> torch.Tensor:
        """Run the prefill on ``prompt`` (B, T); return the last position's logits (B, V)."""
        raise NotImplementedError

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one new token per sequence (B, 1); return the next logits (B, V)."""
        raise NotImplementedError

    def cache_bytes(self) -> int | None:
        """Bytes held by the KV cache now, when the decoder can tell."""
        return None


class _Recompute(Decoder):
    """No cache: each step runs the model on the whole sequence so far."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor]):
        self.forward = forward
        self.seq: torch.Tensor | None = None

    def start(self, prompt: torch.Tensor, max_len: int) -> torch.Tensor:
        self.seq = prompt
        return self.forward(prompt)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        assert self.seq is not None
        self.seq = torch.cat([self.seq, token], dim=1)
        return self.forward(self.seq)


def gpt_prefill(model: GPT, idx: torch.Tensor, cache: KVCache, pos: Any) -> torch.Tensor:
    """The prompt through the model, filling the cache; the last position's logits (B, V)."""
    out: tuple[torch.Tensor, torch.Tensor | None] = model(idx, cache=cache, pos=pos)  # GPT.forward's (logits, loss)
    return out[0][:, -1]


def gpt_decode(model: GPT, idx: torch.Tensor, cache: KVCache, pos: Any) -> torch.Tensor:
    """One new token per sequence through the model; its logits (B, V). The same as
    :func:`gpt_prefill`, but a function of its own: torch.compile keeps its graphs apart."""
    out: tuple[torch.Tensor, torch.Tensor | None] = model(idx, cache=cache, pos=pos)  # GPT.forward's (logits, loss)
    return out[0][:, -1]


class GPTDecoder(Decoder):
    """The built-in GPT with its pre-allocated KV cache.

    Eager runs use the cache's dynamic form (attention over the positions written so far); a
    compiled decoder (:meth:`compile`) uses its static form (attention over the whole cache, masked,
    the position a tensor), so decode has one shape: one graph for decode, one per prompt length.
    """

    def __init__(self, model: GPT, kv_cache: bool = True, dtype: torch.dtype = torch.float32, static: bool = False):
        self.model, self.kv_cache, self.dtype, self.static = model, kv_cache, dtype, static
        self.cache: KVCache | None = None
        self.pos: int | torch.Tensor = 0
        self.prefill: Callable[..., torch.Tensor] = gpt_prefill
        self.decode: Callable[..., torch.Tensor] = gpt_decode
        self._plain = _Recompute(lambda ids: model(ids)[0][:, -1])

    def compile(self, mode: str = "default") -> None:
        """torch.compile prefill and decode apart, static shapes, over the static cache."""
        self.static = True
        self.prefill = torch.compile(gpt_prefill, mode=mode, dynamic=False)
        self.decode = torch.compile(gpt_decode, mode=mode, dynamic=False)

    def start(self, prompt: torch.Tensor, max_len: int) -> torch.Tensor:
        if not self.kv_cache:
            return self._plain.start(prompt, max_len)
        device = prompt.device
        if max_len > self.model.config.block_size:  # a static cache cannot raise inside the model
            raise ConfigError(f"sequence of {max_len} tokens exceeds block_size {self.model.config.block_size}")
        if not (self.static and self.cache is not None and self.cache.k[0].shape[0] == prompt.size(0)
                and self.cache.max_len == max_len and self.cache.k[0].device == device):
            self.cache = KVCache(self.model.config, prompt.size(0), max_len, device, self.dtype, static=self.static)
        # else: a static cache is reused as it is (its address stays put for CUDA graphs): the prefill
        # rewrites positions 0..P-1, decode each next one, and the mask hides what is left of the last run
        self.pos = torch.zeros((), dtype=torch.long, device=device) if self.static else 0
        logits = self.prefill(self.model, prompt, self.cache, self.pos)
        self.pos = self.pos + prompt.size(1)
        return logits

    def step(self, token: torch.Tensor) -> torch.Tensor:
        if not self.kv_cache:
            return self._plain.step(token)
        logits = self.decode(self.model, token, self.cache, self.pos)
        self.pos = self.pos + 1
        return logits

    def cache_bytes(self) -> int | None:
        return self.cache.nbytes() if self.cache is not None else None


def hf_prefill(model: torch.nn.Module, ids: torch.Tensor, cache: Any, positions: torch.Tensor,
               keyword: str = "past_key_values") -> torch.Tensor:
    """A transformers LM's prefill into a static cache; the last position's logits (B, V)."""
    logits: torch.Tensor = model(input_ids=ids, use_cache=True, cache_position=positions, **{keyword: cache}).logits
    return logits[:, -1]


def hf_decode(model: torch.nn.Module, ids: torch.Tensor, cache: Any, positions: torch.Tensor,
              keyword: str = "past_key_values") -> torch.Tensor:
    """One decode step into a static cache (a function of its own: torch.compile keeps its graphs apart)."""
    logits: torch.Tensor = model(input_ids=ids, use_cache=True, cache_position=positions, **{keyword: cache}).logits
    return logits[:, -1]


class HFDecoder(Decoder):
    """A transformers causal LM driven through the cache it returns (workloads/hf_interface.py).

    Eager: transformers' dynamic cache, taken from the prefill's output and fed back under the same
    name. Compiled (:meth:`compile`): its ``StaticCache`` where the model supports it
    (``_can_compile_fullgraph``), prefill and decode compiled apart with static shapes. With the cache
    on, a model that returns no cache is an error, never a silent re-run of the whole sequence.
    """

    def __init__(self, model: torch.nn.Module, kv_cache: bool = True):
        self.model, self.kv_cache = model, kv_cache
        self.past: Any = None
        self.keyword = "past_key_values"  # replaced by the name the model's own output uses
        self.static = False
        self.pos = 0
        # Whether decode feeds every token so far (asked of the model at its first decode step, then
        # kept: None until then) and the sequence so far while that may be so.
        self.whole: bool | None = None
        self.seq: torch.Tensor | None = None
        self.prefill: Callable[..., torch.Tensor] = hf_prefill
        self.decode: Callable[..., torch.Tensor] = hf_decode
        self._plain = _Recompute(lambda ids: model(input_ids=ids, use_cache=False).logits[:, -1])

    def compile(self, mode: str = "default") -> str | None:
        """torch.compile the model's calls; a note when it cannot use a static cache (else None)."""
        if supports_static_cache(self.model):
            self.static = True
            self.prefill = torch.compile(hf_prefill, mode=mode, dynamic=False)
            self.decode = torch.compile(hf_decode, mode=mode, dynamic=False)
            return None
        self.model = torch.compile(self.model, mode=mode)  # type: ignore[assignment]  # the compiled wrapper stands in for the model (same forward, attributes forwarded)
        return (f"torch.compile: {type(self.model).__name__} does not support transformers' static KV cache "
                "(_can_compile_fullgraph is false): compiled with its dynamic cache, so decode may recompile "
                "as the cache grows (see tables.compile)")

    def start(self, prompt: torch.Tensor, max_len: int) -> torch.Tensor:
        if not self.kv_cache:
            return self._plain.start(prompt, max_len)
        if self.static:
            from transformers import PretrainedConfig, StaticCache

            config = self.model.config
            # static only when the model sets _can_compile_fullgraph, a PreTrainedModel's flag, and
            # every PreTrainedModel holds a PretrainedConfig
            assert isinstance(config, PretrainedConfig)
            self.keyword = cache_keyword(self.model, prompt.device)
            self.past = StaticCache(config=config, max_cache_len=max_len)
            positions = torch.arange(prompt.size(1), device=prompt.device)
            self.pos = prompt.size(1)
            return self.prefill(self.model, prompt, self.past, positions, self.keyword)
        self.seq = prompt
        out = self.model(input_ids=prompt, use_cache=True)
        self.keyword, self.past = require_cache(self.model, out)
        logits: torch.Tensor = out.logits  # a transformers CausalLMOutput
        return logits[:, -1]

    def step(self, token: torch.Tensor) -> torch.Tensor:
        if not self.kv_cache:
            return self._plain.step(token)
        if self.static:
            positions = torch.full((1,), self.pos, dtype=torch.long, device=token.device)
            self.pos += 1
            return self.decode(self.model, token, self.past, positions, self.keyword)
        ids = token
        if self.whole is not False and self.seq is not None:
            self.seq = torch.cat([self.seq, token], dim=1)
            if self.whole is None:
                self.whole = wants_whole_sequence(self.model, self.seq, {self.keyword: self.past})
            ids = self.seq if self.whole else token
        out = self.model(input_ids=ids, use_cache=True, **{self.keyword: self.past})
        self.keyword, self.past = require_cache(self.model, out)
        logits: torch.Tensor = out.logits  # a transformers CausalLMOutput
        return logits[:, -1]

    def cache_bytes(self) -> int | None:
        if self.past is None:
            return None
        return cache_bytes(self.past) or None


def _logits_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        logits: torch.Tensor = output.logits  # a transformers-style output object
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ConfigError("the model's output has no logits: return a (B, T, V) tensor, a tuple starting with it, or an object with .logits")


def decoder_for(model: torch.nn.Module, kv_cache: bool = True, dtype: torch.dtype = torch.float32) -> tuple[Decoder, list[str]]:
    """The right decoder for ``model`` and notes on what it could not do (e.g. no KV cache)."""
    if isinstance(model, GPT):
        return GPTDecoder(model, kv_cache, dtype), []
    if is_generation_model(model):  # transformers' own class for models that generate with a cache
        return HFDecoder(model, kv_cache), []
    notes = []
    if kv_cache:
        notes.append(f"{type(model).__name__} is not a transformers GenerationMixin model, so lmprof knows no KV "
                     "cache interface for it: every decode step re-runs the whole sequence")
    return _Recompute(lambda ids: _logits_of(model(ids))[:, -1]), notes
