"""Canonical block names and the scopes that mark them in a profiler trace.

A scope is a ``torch.profiler.record_function`` range named ``lmprof:<block>``. Scopes are off unless
:func:`scopes_enabled` is active, so the clean timing phase pays nothing for them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

SCOPE_PREFIX = "lmprof:"

# Sub-blocks of the forward pass, in data-flow order. attn.sdpa replaces scores/softmax/av when the
# fused kernel is used.
FORWARD_BLOCKS: tuple[str, ...] = (
    "embedding",
    "ln_1",
    "attn.qkv",
    "attn.scores",
    "attn.softmax",
    "attn.av",
    "attn.sdpa",
    "attn.proj",
    "residual",
    "ln_2",
    "mlp.fc",
    "mlp.act",
    "mlp.proj",
    "ln_f",
    "lm_head",
    "loss",
)

# Parts of a training step that enclose the blocks above.
STEP_PARTS: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "zero_grad")
# Parts of an inference run.
INFER_PARTS: tuple[str, ...] = ("prefill", "decode")

_enabled = False


@contextlib.contextmanager
def scopes_enabled(on: bool = True) -> Iterator[None]:
    """Turn block scopes on (for the profiled phase) within the ``with`` body."""
    global _enabled
    before = _enabled
    _enabled = on
    try:
        yield
    finally:
        _enabled = before


def scopes_are_enabled() -> bool:
    return _enabled


def scope(name: str) -> contextlib.AbstractContextManager[object]:
    """A named range ``lmprof:<name>`` when scopes are enabled, else a no-op."""
    if _enabled:
        return torch.profiler.record_function(SCOPE_PREFIX + name)
    return contextlib.nullcontext()


def block_of(event_name: str) -> str | None:
    """The block name of a scope event, or None when the event is not an lmprof scope."""
    if event_name.startswith(SCOPE_PREFIX):
        return event_name[len(SCOPE_PREFIX):]
    return None
