"""Which kernel ``F.scaled_dot_product_attention`` runs: fused (flash / memory-efficient) or math.

The rule decides what attention keeps for backward (fused: q, k, v, output and a log-sum-exp; math:
the scores, probabilities and dropout mask), so the memory estimate follows the path that runs, not
the one asked for. It restates PyTorch's own selection (aten/src/ATen/native/transformers/
sdp_utils_cpp.{h,cpp} for the CPU, cuda/sdp_utils.cpp for CUDA) for the inputs transformer LMs pass:
dense 4-D q/k/v with equal head sizes, the last dimension contiguous, no mask or a broadcastable one.

* CPU: the flash kernel needs dropout 0 (``check_for_dropout``) and fp32, fp64, bf16 or fp16 inputs;
  anything else falls back to math. So a model that trains with attention dropout (Hugging Face
  GPT-2's ``attn_pdrop`` 0.1) runs math on the CPU in train mode, and fused in eval mode.
* CUDA: flash and memory-efficient attention both implement dropout (the mask is regenerated from
  the RNG state in backward), and memory-efficient takes fp32: fused.
* MPS: taken as math (its kernel materialises the scores), the conservative choice for memory.
"""
from __future__ import annotations

from typing import Literal

SdpaPath = Literal["fused", "math"]
_CPU_FUSED_DTYPES = ("fp32", "fp64", "bf16", "fp16")


def sdpa_path(device_kind: str, dtype: str, attention_dropout: float, training: bool = True) -> SdpaPath:
    """The kernel ``scaled_dot_product_attention`` picks on ``device_kind`` for ``dtype`` inputs.

    ``attention_dropout`` is the rate the model passes in train mode (0 in eval mode).
    """
    dropout = attention_dropout if training else 0.0
    if device_kind == "cpu":
        return "fused" if dropout == 0.0 and dtype in _CPU_FUSED_DTYPES else "math"
    if device_kind == "mps":
        return "math"
    return "fused"
