"""Where a model drops activations while it trains, and at what rate: the sites that keep a mask.

Dropout decides two things the memory estimate needs: which tensors keep a mask for backward, and
(for the attention probabilities) which attention kernel PyTorch runs (estimate/sdpa_path.py).
One description for the built-in GPT (one rate everywhere but inside the MLP) and Hugging Face
configs (each family names its rates differently). No torch import: this is data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from lmprof.errors import ConfigError

# The config key each site's rate is read from, per Hugging Face model_type, as transformers' modeling
# code uses them (5.x): GPT-2 drops embeddings, probabilities and both branches; OPT both branches
# ("dropout") and the probabilities; Phi-3 both branches (resid_pdrop); GPT-NeoX embeddings and both
# branches (hidden_dropout); Falcon the parallel branches' sum once (hidden_dropout), and never the
# probabilities with rotary positions (it passes dropout_p=0 to SDPA); the Llama-like families only
# the probabilities (attention_dropout).
_ATTN = {"attention": "attention_dropout"}
_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {"embedding": "embd_pdrop", "attention": "attn_pdrop", "residual": "resid_pdrop"},
    "opt": {"attention": "attention_dropout", "residual": "dropout"},
    "phi3": {"attention": "attention_dropout", "residual": "resid_pdrop"},
    "gpt_neox": {"embedding": "hidden_dropout", "attention": "attention_dropout", "residual": "hidden_dropout"},
    "falcon": {"residual": "hidden_dropout"},
    **{family: _ATTN for family in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "gemma2")},
}
# transformers' config defaults where they are not 0, for configs that leave the key out (the shipped
# model table writes sizes only): GPT2Config's three rates and OPTConfig's dropout are 0.1.
_DEFAULTS: dict[str, dict[str, float]] = {
    "gpt2": {"embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1},
    "opt": {"dropout": 0.1},
}


@dataclass(frozen=True)
class Dropout:
    """Dropout rates in training by site.

    ``embedding``: on the summed token and position embeddings (once). ``attention``: on the
    attention probabilities (every layer; decides the SDPA kernel). ``residual``: on each branch
    output before it joins the residual stream (attention and MLP, every layer). ``activation``:
    inside the MLP, after its activation (every layer).
    """

    embedding: float = 0.0
    attention: float = 0.0
    residual: float = 0.0
    activation: float = 0.0

    def __post_init__(self) -> None:
        for site in ("embedding", "attention", "residual", "activation"):
            value = getattr(self, site)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"{site} dropout must be in [0, 1), got {str(value)[:40]!r}")

    @classmethod
    def uniform(cls, p: float) -> Dropout:
        """The built-in GPT's dropout: one rate on the embeddings, the probabilities and both branches."""
        return cls(embedding=p, attention=p, residual=p)

    @property
    def any(self) -> bool:
        return bool(self.embedding or self.attention or self.residual or self.activation)

    @property
    def largest(self) -> float:
        return max(self.embedding, self.attention, self.residual, self.activation)


def dropout_from_config(cfg: Mapping[str, Any]) -> Dropout:
    """The training dropout of a Hugging Face causal-LM config (a config.json as a dict).

    Keys the config leaves out take transformers' defaults for its model_type; a model_type lmprof
    does not describe has no dropout here.
    """
    mt = str(cfg.get("model_type") or "")
    defaults = _DEFAULTS.get(mt, {})
    rates: dict[str, float] = {}
    for site, key in _KEYS.get(mt, {}).items():
        value = cfg.get(key, defaults.get(key))
        rates[site] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
    return Dropout(**rates)


def dropout_at(model_type: str, p: float) -> Dropout:
    """Every dropout site a Hugging Face family has, at rate ``p`` (``lmprof memory --model ... --dropout p``)."""
    return Dropout(**{site: p for site in _KEYS.get(model_type, {})})
