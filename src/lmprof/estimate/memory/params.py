"""Parameter bookkeeping beyond n_params: tensor counts, the largest tensor, matmul weights, buffers."""
from __future__ import annotations

from dataclasses import dataclass

from lmprof.estimate.memory.result import BOOL
from lmprof.estimate.shape import ModelShape


@dataclass(frozen=True)
class ParamCounts:
    """What the estimate needs to know of the parameters (element counts; ``tensors`` and ``largest`` size optimizer extras)."""

    total: int
    tensors: int
    largest: int
    matmul_weights: int
    matmul_weights_per_layer: int
    linear_biases: int
    layer_params: int
    layer_tensors: int = 0
    norm_tensors: int = 0
    layer_largest: int = 0  # the largest tensor inside one layer (qkv or the MLP's, all experts if 3-D)


def param_parts(shape: ModelShape) -> ParamCounts:
    """Counts the estimate needs beyond n_params: tensors, the largest tensor, matmul weights.

    Tensor counts follow the built-in GPT's layout (fused qkv projection); for other families they
    only size the AdamW step scalars (4 B per tensor), so the layout difference is negligible.
    """
    d, v = shape.n_embd, shape.vocab_size
    f = shape.expert_ffn if shape.moe else shape.ffn
    has_bias = 1 if shape.bias else 0
    norm_tensors = 2 if shape.has_norm_bias else 1
    mlp_mats = (3 if shape.gated else 2) * (shape.n_experts or 1)
    layer_w = shape.attn_weights() + shape.mlp_weights()
    layer_b = shape.attn_biases() + (shape.mlp_params() - shape.mlp_weights())
    layer_tensors = shape.norms_per_layer * norm_tensors + 2 * (1 + has_bias) + mlp_mats * (1 + has_bias)
    tensors = 1 + (1 if shape.pos == "learned" else 0) + (0 if shape.tied else 1)
    tensors += shape.n_layer * layer_tensors + norm_tensors
    layer_largest = max(d * (shape.q_dim + 2 * shape.kv_dim), f * d * (shape.n_experts or 1) if shape.family in (
        "mixtral",) else f * d)
    largest = max(v * d, layer_largest, shape.positions * d)
    # The lm_head's weight is a matmul weight (tied or not); the token embedding is a lookup.
    return ParamCounts(
        total=shape.n_params(),
        tensors=tensors,
        largest=largest,
        matmul_weights=shape.matmul_weights(),
        matmul_weights_per_layer=layer_w,
        linear_biases=shape.n_layer * layer_b,
        layer_params=shape.layer_params(),
        layer_tensors=layer_tensors,
        norm_tensors=norm_tensors,
        layer_largest=layer_largest,
    )


def causal_mask_bytes(shape: ModelShape) -> int:
    """The built-in GPT's ``mask`` buffer: a (block_size, block_size) bool per layer (none elsewhere)."""
    if shape.family not in ("", "gpt"):
        return 0
    return shape.n_layer * shape.block_size * shape.block_size * BOOL
