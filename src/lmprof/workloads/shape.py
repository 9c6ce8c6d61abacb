"""The shape of a decoder-only transformer: everything FLOP, byte and memory formulas need.

Built from the built-in GPT's config (:func:`lmprof.workloads.gpt.GPTConfig.shape`) or from a Hugging
Face config (:mod:`lmprof.workloads.hf`), so analytic counts never need the model itself.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from lmprof.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer LM.

    ``mlp="gelu"`` is the GPT-2 two-matrix MLP (d -> d_ff -> d); ``mlp="swiglu"`` is the Llama
    three-matrix gated MLP. ``n_kv_head`` < ``n_head`` means grouped-query attention.
    """

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    n_kv_head: int | None = None
    d_ff: int | None = None
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    pos: Literal["learned", "rope"] = "learned"
    bias: bool = True
    tied: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        for field in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"{field} must be positive, got {getattr(self, field)}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn(self) -> int:
        return self.d_ff or 4 * self.n_embd

    def n_params(self) -> int:
        """Exact parameter count of this architecture (tied lm_head counted once)."""
        d, v, L = self.n_embd, self.vocab_size, self.n_layer
        kv = self.kv_heads * self.head_dim
        b = 1 if self.bias else 0
        norm = d * (2 if (self.norm == "layernorm" and self.bias) else 1)
        attn = d * (d + 2 * kv) + b * (d + 2 * kv) + d * d + b * d
        if self.mlp == "gelu":
            mlp = 2 * d * self.ffn + b * (self.ffn + d)
        else:
            mlp = 3 * d * self.ffn + b * (2 * self.ffn + d)
        layer = 2 * norm + attn + mlp
        embed = v * d + (self.block_size * d if self.pos == "learned" else 0)
        head = 0 if self.tied else v * d
        return embed + L * layer + norm + head

    def n_params_non_embedding(self) -> int:
        """Parameters minus the position embeddings: nanoGPT's N for the 6N FLOPs rule.

        The token embedding stays in when tied, because it is also the lm_head's matmul weight.
        """
        pos = self.block_size * self.n_embd if self.pos == "learned" else 0
        tok = 0 if self.tied else self.vocab_size * self.n_embd
        return self.n_params() - pos - tok

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
