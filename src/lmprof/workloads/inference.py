"""What a generation is: a decoder over a model, a prompt batch, and greedy decoding timed per step.

Greedy decoding with a fixed number of new tokens (no early stop on EOS), for a batch of prompts.
TTFT is the prefill including the first token's choice; TPOT is each later token's step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from lmprof.hardware.devices import Device
from lmprof.workloads.blocks import step_scope
from lmprof.workloads.decoding import Decoder
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


@dataclass
class Generation:
    """One timed generation: prefill and per-step decode seconds, the new tokens."""

    prefill_s: float
    decode_s: list[float]
    tokens: torch.Tensor


def generate(work: InferWorkload, clock: Callable[[], float] = time.perf_counter,
             on_prefill: Callable[[], object] | None = None) -> Generation:
    """One greedy generation, timed: device synced after the prefill and after every decode step.
    ``on_prefill`` is called once the prefill is timed (outside every timed span)."""
    sync = work.device.synchronize
    prompt = work.prompt
    max_len = prompt.size(1) + work.new_tokens - 1  # the last new token is never fed back
    sync()
    t0 = clock()
    with step_scope("prefill"):
        logits = work.decoder.start(prompt, max_len)
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    sync()
    prefill = clock() - t0
    if on_prefill is not None:
        on_prefill()
    tokens, decode = [token], []
    for _ in range(work.new_tokens - 1):
        t = clock()
        with step_scope("decode"):
            logits = work.decoder.step(token)
            token = logits.argmax(dim=-1, keepdim=True)
        sync()
        decode.append(clock() - t)
        tokens.append(token)
    return Generation(prefill, decode, torch.cat(tokens, dim=1))
