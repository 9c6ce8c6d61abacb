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
from lmprof.estimate.families import family

# The config key each site's rate is read from, and transformers' default where it is not 0, are each
# family's record (estimate/families.py, models.yaml): as transformers' modeling code uses them (5.x),
# GPT-2 drops embeddings, probabilities and both branches; OPT both branches ("dropout") and the
# probabilities; Phi-3 both branches (resid_pdrop); GPT-NeoX embeddings and both branches
# (hidden_dropout); Falcon the parallel branches' sum once (hidden_dropout), and never the
# probabilities with rotary positions (it passes dropout_p=0 to SDPA); the Llama-like families only
# the probabilities (attention_dropout).


def _sites(model_type: str) -> tuple[dict[str, str], dict[str, float]]:
    rec = family(model_type)
    return (dict(rec.dropout), dict(rec.dropout_defaults)) if rec is not None else ({}, {})


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
    keys, defaults = _sites(str(cfg.get("model_type") or ""))
    rates: dict[str, float] = {}
    for site, key in keys.items():
        value = cfg.get(key, defaults.get(key))
        rates[site] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
    return Dropout(**rates)


def dropout_at(model_type: str, p: float) -> Dropout:
    """Every dropout site a Hugging Face family has, at rate ``p`` (``lmprof memory --model ... --dropout p``)."""
    return Dropout(**{site: p for site in _sites(model_type)[0]})
