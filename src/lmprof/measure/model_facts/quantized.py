"""Whether a model's weights are quantized, read off its modules.

Quantization changes the number formats a model computes in, not its math: the model FLOPs of its
config stand. What changes is what they are measured against: the weights' bytes are not the model's
dtype's (1 byte an int8 weight, half a byte a 4-bit one), and where the matmuls themselves run in int8
(torch.ao's dynamic quantization, bitsandbytes' LLM.int8) the peak is an int8 one, which lmprof does not
know. Such weights are also not ``nn.Parameter`` s of their logical shape (torch.ao keeps them packed in
C++ objects, bitsandbytes packs two 4-bit values a byte), so the model's parameter count is taken at
their logical shape before it is held against its config's.

torch's FlopCounterMode counts no quantized kernel (``quantized::linear_dynamic`` is not among its ops):
a count of a quantized model's step misses its matmuls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# bitsandbytes' layers: whether their matmuls run in int8 (LLM.int8) or in the activations' dtype after
# the weights are dequantized (4-bit)
_BNB = {"Linear8bitLt": "int8", "Linear4bit": None, "LinearNF4": None, "LinearFP4": None}


@dataclass(frozen=True)
class Quantized:
    """How a model's weights are quantized."""

    kind: str  # what quantized them, for a note ("torch.ao dynamic quantization (qint8)")
    layers: int  # quantized layers found
    # The number format its matmuls run in where it is not the activations' dtype ("int8", "fp16");
    # None: they run in the activations' dtype (weight-only quantization); "unknown": not known here.
    matmuls: str | None
    hidden: int  # weights beyond model.parameters()' count, at their logical shape (packed, or in C++ objects)


def quantized(model: torch.nn.Module) -> Quantized | None:
    """How ``model``'s weights are quantized; None when none of its layers is."""
    kinds: dict[str, str | None] = {}
    layers = hidden = 0
    for m in model.modules():
        found = _layer(m)
        if found is None:
            continue
        kind, matmuls, extra = found
        kinds.setdefault(kind, matmuls)
        layers += 1
        hidden += extra
    method = _hf_method(model)
    if not kinds and method is None:
        return None
    if not kinds:  # transformers says so, but no layer lmprof knows: GPTQ, AWQ, HQQ kernels
        return Quantized(f"{method} (the model's quantization_config)", 0, "unknown", _unknown_hidden(model))
    formats = set(kinds.values())
    return Quantized(", ".join(kinds), layers, formats.pop() if len(formats) == 1 else "unknown", hidden)


def _layer(m: Any) -> tuple[str, str | None, int] | None:
    """A quantized layer's kind, matmul format and weights beyond its parameters; None: not quantized
    (``m``: a module, read by the attributes its kind has)."""
    cls = type(m)
    if cls.__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")) and callable(getattr(m, "weight", None)):
        try:
            w, b = m.weight(), (m.bias() if callable(getattr(m, "bias", None)) else None)
        except Exception:  # noqa: BLE001 - a packed weight torch cannot unpack here: not counted
            return None
        dynamic = "dynamic" in cls.__module__
        stored = getattr(getattr(m, "_packed_params", None), "dtype", w.dtype)  # fp16 weights unpack as fp32
        # fbgemm's fp16 weights are widened to fp32 inside its matmul: they run in the activations' dtype
        fmt = "int8" if w.is_quantized else None if stored in (torch.float16, torch.bfloat16) else "unknown"
        what = f"torch.ao {'dynamic ' if dynamic else ''}quantization ({str(stored).removeprefix('torch.')})"
        return what, fmt, w.numel() + (b.numel() if b is not None else 0)
    if cls.__name__ in _BNB and hasattr(m, "in_features") and hasattr(m, "out_features"):
        weight = getattr(m, "weight", None)
        held = weight.numel() if isinstance(weight, torch.Tensor) else 0
        bits = "8-bit" if _BNB[cls.__name__] else "4-bit"
        return f"bitsandbytes {bits}", _BNB[cls.__name__], max(0, int(m.in_features) * int(m.out_features) - held)
    weight = getattr(m, "weight", None)
    if isinstance(weight, torch.Tensor) and type(weight.data).__module__.startswith("torchao"):
        return f"torchao ({type(weight.data).__name__})", "unknown", 0
    return None


def _hf_method(model: torch.nn.Module) -> str | None:
    """The quantization method transformers records on the model's config, if any."""
    qc: Any = getattr(getattr(model, "config", None), "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method) or "quantized")


def _unknown_hidden(model: torch.nn.Module) -> int:
    """Weights of linear layers that hold no floating-point weight of their shape (GPTQ's and AWQ's keep
    them packed in integer buffers), at their logical shape."""
    out = 0
    for m in model.modules():
        n_in, n_out = (getattr(m, a, None) for a in ("in_features", "out_features"))
        if n_in is None:
            n_in, n_out = getattr(m, "infeatures", None), getattr(m, "outfeatures", None)
        if not isinstance(n_in, int) or not isinstance(n_out, int) or isinstance(m, torch.nn.Linear):
            continue
        weight = getattr(m, "weight", None)
        if not (isinstance(weight, torch.Tensor) and weight.is_floating_point() and weight.numel() == n_in * n_out):
            out += n_in * n_out
    return out
