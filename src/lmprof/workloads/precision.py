"""Torch dtypes for lmprof's dtype names (fp32, bf16, fp16), both ways."""
from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """lmprof's name of a torch dtype (fp32 for anything it has no name for)."""
    return {v: k for k, v in TORCH_DTYPES.items()}.get(dtype, "fp32")
