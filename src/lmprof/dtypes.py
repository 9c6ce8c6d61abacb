"""Dtype names and widths: the vocabulary every layer shares (no torch import).

Compute dtypes (``fp64 fp32 tf32 bf16 fp16 fp8``) have a peak FLOP/s and an element width. Weight
storage formats add the weight-only integer ones (``int8``, ``int4``), stored with one scale per
group of ``group`` weights (an fp16 scale, the common GPTQ/AWQ layout), so their width is
fractional (:func:`weight_bytes_per_param`).
"""
from __future__ import annotations

from lmprof.errors import ConfigError

# Bytes per element of each compute dtype, under its canonical short name.
DTYPE_BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

_DTYPE_ALIASES: dict[str, str] = {
    "float64": "fp64", "double": "fp64", "fp64": "fp64",
    "float32": "fp32", "float": "fp32", "fp32": "fp32", "f32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "fp16": "fp16", "f16": "fp16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}

# Weight-only integer formats: bits per weight (scales added per group, see weight_bytes_per_param).
INT_WEIGHT_BITS: dict[str, int] = {"int8": 8, "int4": 4}
DEFAULT_GROUP = 128  # weights sharing one fp16 scale (GPTQ / AWQ default)
SCALE_BYTES = 2  # one fp16 scale per group


def normalize_dtype(dtype: object) -> str:
    """Canonical short dtype name (fp32, tf32, bf16, fp16, fp8, fp64) of a string or torch.dtype."""
    text = str(dtype).strip().lower().removeprefix("torch.")
    if text not in _DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of fp32, tf32, bf16, fp16, fp8")
    return _DTYPE_ALIASES[text]


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of ``dtype`` (tf32 is stored as fp32: 4 bytes)."""
    return DTYPE_BYTES[normalize_dtype(dtype)]


def normalize_weight_dtype(dtype: object) -> str:
    """A weight storage format: a compute dtype name, or int8 / int4 (weight-only quantisation)."""
    text = str(dtype).strip().lower().removeprefix("torch.")
    if text in INT_WEIGHT_BITS:
        return text
    try:
        return normalize_dtype(text)
    except ConfigError:
        raise ConfigError(
            f"unknown weight dtype {dtype!r}: use one of fp32, bf16, fp16, fp8, int8, int4"
        ) from None


def weight_bytes_per_param(dtype: object, group: int = DEFAULT_GROUP) -> float:
    """Bytes per stored matmul weight: the dtype's width, or for int8/int4 bits/8 + a 2-byte scale per group.

    int4 with groups of 128: 0.5 + 2/128 = 0.515625 B; int8: 1 + 2/128 = 1.015625 B.
    """
    name = normalize_weight_dtype(dtype)
    if name in INT_WEIGHT_BITS:
        if not isinstance(group, int) or group <= 0:
            raise ConfigError(f"quantisation group size must be a positive integer, got {group!r}")
        return INT_WEIGHT_BITS[name] / 8 + SCALE_BYTES / group
    return float(DTYPE_BYTES[name])
