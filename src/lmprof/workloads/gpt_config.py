"""The built-in GPT's configuration and presets, torch-free: ``lmprof memory`` and ``roofline``
estimate from them, and a bad value is refused before torch is imported."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from lmprof.errors import ConfigError
from lmprof.estimate.shape import ModelShape

Attention = Literal["math", "sdpa"]


@dataclass(frozen=True)
class GPTConfig:
    """nanoGPT's GPTConfig plus the attention implementation."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 256
    vocab_size: int = 65
    dropout: float = 0.0
    bias: bool = True
    tied: bool = True
    attention: Attention = "math"

    def validate(self) -> "GPTConfig":
        """Raise ConfigError on an impossible configuration; return self."""
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ("math", "sdpa"):
            raise ConfigError(f"attention must be 'math' or 'sdpa', got {self.attention!r}")
        return self

    def shape(self) -> ModelShape:
        return ModelShape(
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            bias=self.bias,
            tied=self.tied,
            name="gpt",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, GPTConfig] = {
    # llmProfiler's quick test: character-level vocabulary, 128 wide.
    "tiny": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=65),
    # nanoGPT's shakespeare_char model.
    "small": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65),
    # GPT-2 (124M).
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}


def check_preset(name: str) -> None:
    """ConfigError unless ``name`` is a preset (the CLI asks before torch is imported)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")


def preset(name: str, **overrides: Any) -> GPTConfig:
    """A preset config with overrides applied and validated."""
    check_preset(name)
    clean = {k: v for k, v in overrides.items() if v is not None}
    return replace(PRESETS[name], **clean).validate()
