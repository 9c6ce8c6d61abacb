"""What lmprof can say about a module it did not build: its shape, attention path and dropout.

A user's model reaches lmprof as a plain ``nn.Module`` (``lmprof run``, ``lmprof.profile``, the
callbacks). When it is the built-in GPT or a Hugging Face causal LM of a family lmprof describes,
the same analytic model ``lmprof train`` uses applies; anything else gets None, and the caller
counts FLOPs instead.
"""
from __future__ import annotations

from typing import Literal

import torch

from lmprof.estimate.dropout import Dropout
from lmprof.estimate.shape import ModelShape


def inner_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's and DDP's wrappers."""
    for attr in ("_orig_mod", "module"):
        inner = getattr(model, attr, None)
        if isinstance(inner, torch.nn.Module):
            model = inner
    return model


def describe_module(model: torch.nn.Module) -> ModelShape | None:
    """lmprof's description of ``model``: the built-in GPT or a described HF family; else None."""
    from lmprof.workloads.gpt import GPT
    from lmprof.workloads.hf import shape_of

    m = inner_module(model)
    if isinstance(m, GPT):
        return m.config.shape()
    return shape_of(m)


def attention_path(model: torch.nn.Module) -> Literal["math", "sdpa"]:
    """Whether the model's attention is a fused kernel (sdpa, flash, flex) or the math path."""
    from lmprof.workloads.gpt import GPT
    from lmprof.workloads.hf_interface import attention_implementation

    m = inner_module(model)
    if isinstance(m, GPT):
        return "sdpa" if m.config.attention == "sdpa" else "math"
    impl = attention_implementation(m)
    return "math" if impl in (None, "eager") else "sdpa"


def dropout_of(model: torch.nn.Module) -> float | Dropout:
    """The dropout the model trains with, what its memory estimate needs: the built-in GPT's rate, a
    Hugging Face model's rates by site (from its config), else 0."""
    from lmprof.workloads.gpt import GPT
    from lmprof.workloads.hf_interface import training_dropout

    m = inner_module(model)
    return float(m.config.dropout) if isinstance(m, GPT) else training_dropout(m)
