"""Where a model's figures come from, decided once for every command: formulas, the describer, or a guess.

A family lmprof's formulas know keeps them (the fast path, no torch). Any other family is read off
the model by the describer. When the describer cannot build or run it, the command stops with one
line naming why, unless the user asked for the generic Llama-like guess (``--allow-generic``), which
is then marked ``generic`` and refused for configs with expert, hybrid-layer or latent-attention
fields (:func:`lmprof.estimate.models.generic_entry`).
"""
from __future__ import annotations

from typing import Any

from lmprof.errors import ConfigError, LmprofError
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.models import ModelEntry, generic_entry, generic_refusal


def describe_entry(entry: ModelEntry, *, allow_generic: bool = False, **describe_kw: Any
                   ) -> tuple[ModelEntry, ModelFacts | None]:
    """``(entry, facts)`` for an entry of ``figures="model"``: the describer's facts, or with
    ``allow_generic`` the generic entry (and None) when the describer cannot read the model.

    Formula and generic entries come back as they are, with no facts. ConfigError (one line) when
    the describer fails and no guess is allowed or possible.
    """
    if entry.figures != "model":
        return entry, None
    from lmprof.measure.model_facts.describe import describe

    try:
        return entry, describe(entry.config or {}, name=entry.name, **describe_kw)
    except LmprofError as exc:  # ConfigError from the describer, or transformers missing
        why = str(exc)
        if allow_generic:
            return generic_entry(entry, why=why), None
        hint = "" if generic_refusal(entry.config or {}) else "; --allow-generic gives a generic Llama-like guess"
        raise ConfigError(f"{why}{hint}") from None
