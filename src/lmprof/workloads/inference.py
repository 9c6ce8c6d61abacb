"""What a generation is: a decoder over a model, a prompt batch, and greedy decoding.

Greedy decoding with a fixed number of new tokens (no early stop on EOS), for a batch of prompts. The
device is synchronized after the prefill and after every decode step, where the caller's
``on_forward`` is called: the measurement session's clock times generations there, the same way for
lmprof's loop as for a user's (pipeline/protocol/timing.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from lmprof.hardware.devices import Device
from lmprof.workloads.blocks import step_scope
from lmprof.workloads.decoding import Decoder
from lmprof.workloads.hf_interface import is_generation_model
from lmprof.estimate.shape import ModelShape


@dataclass
class InferWorkload:
    """What runs: a decoder over a model, the prompt batch and where it runs."""

    model: torch.nn.Module
    decoder: Decoder
    prompt: torch.Tensor
    new_tokens: int
    device: Device
    shape: ModelShape | None = None
    tokenizer: Any = None
    scopes: Callable[[], ContextManager[object]] | None = None
    notes: list[str] = field(default_factory=list)


def generate(work: InferWorkload, on_forward: Callable[[], object] | None = None) -> torch.Tensor:
    """One greedy generation; the new tokens (B, new_tokens). ``on_forward`` is called as each forward
    (the prefill, then each decode step) has ended, the device synchronized, its token chosen."""
    sync = work.device.synchronize
    prompt = work.prompt
    max_len = prompt.size(1) + work.new_tokens - 1  # the last new token is never fed back
    sync()
    with step_scope("prefill"):
        logits = work.decoder.start(prompt, max_len)
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    sync()
    if on_forward is not None:
        on_forward()
    tokens = [token]
    for _ in range(work.new_tokens - 1):
        with step_scope("decode"):
            logits = work.decoder.step(token)
            token = logits.argmax(dim=-1, keepdim=True)
        sync()
        if on_forward is not None:
            on_forward()
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def own_generation(work: InferWorkload) -> None:
    """The model's own greedy generation of the same tokens, as a referee of whose failure one is:
    transformers' ``generate()`` for its models (not lmprof's cache driver), the greedy loop above for
    the built-in GPT, whose own it is."""
    with torch.inference_mode():
        if is_generation_model(work.model):
            kv_cache = bool(getattr(work.decoder, "kv_cache", True))
            own: Callable[..., Any] = getattr(work.model, "generate")  # noqa: B009 - GenerationMixin's, untyped on Module
            own(work.prompt, max_new_tokens=work.new_tokens, min_new_tokens=work.new_tokens, do_sample=False,
                use_cache=kv_cache)
        else:
            generate(work)
