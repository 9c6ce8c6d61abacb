"""Whether a model runs as its config describes it, read off the module itself.

lmprof's formulas, and a model read off the meta device, start from the model's config: every weight the
config builds, trained as the config's model trains it. A fine-tuning loop changes both without touching
the config: it freezes weights (a frozen weight gets no gradient, so its backward does a third less work,
and a frozen prefix of layers none at all), or adds weights the config does not know (LoRA adapters, a
new head, an untied ``lm_head``). The config's figures then overstate the step: 1.46x for LoRA adapters on
a small GPT-2's attention, 2.9x for a head-only fine-tune, against torch's FlopCounterMode over the step.

Some families freeze weights of their own (sinusoidal position tables, a router's bias correction): a
frozen weight is a departure only where the model the config builds (on the meta device) trains it.
"""
from __future__ import annotations

import warnings

import torch


def departure(model: torch.nn.Module, described_params: int | None, *, trains: bool, hidden: int = 0) -> str | None:
    """How ``model`` departs from the model its config describes (``described_params``: the parameters the
    config builds, None when not known here), in a clause for a note; None when it does not, as far as its
    parameters tell. ``trains``: the steps train the model, so frozen weights change their FLOPs; ``hidden``:
    its weights that are not parameters of it, at their logical shape (quantized ones packed elsewhere:
    ``Quantized.hidden``)."""
    from lmprof.workloads.describe import inner_module

    m = inner_module(model)
    params = dict(m.named_parameters())  # a weight tied to another is listed once
    total = sum(p.numel() for p in params.values()) + hidden
    why = []
    if described_params is not None and total != described_params:
        why.append(departure_clause(total, described_params))
    if trains:
        frozen = {n for n, p in params.items() if p.is_floating_point() and not p.requires_grad}
        # (bitsandbytes' packed weights are integer tensors, never trained: not frozen by the loop)
        if frozen:
            frozen -= _frozen_as_built(m)
        if frozen:
            why.append(f"the loop freezes {sum(params[n].numel() for n in frozen):,} of its {total:,} parameters "
                       "that the config's model trains (they get no gradient)")
    return "; ".join(why) or None


def _frozen_as_built(model: torch.nn.Module) -> set[str]:
    """The parameters a Hugging Face model's config builds frozen (by name; on the meta device, no storage);
    none for other models, or where the config does not build."""
    from lmprof.measure.model_facts.meta import build_on_meta
    from lmprof.workloads.hf import config_dict

    config = config_dict(model)
    if config is None:
        return set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = build_on_meta(config)
    except Exception:  # noqa: BLE001 - a config that does not build (a ConfigError, or transformers' own): every
        return set()  # frozen weight counts as the loop's
    return {n for n, p in built.named_parameters() if not p.requires_grad}


def departure_clause(params: int, described_params: int) -> str:
    """The clause for a model of ``params`` parameters whose config builds ``described_params``."""
    return (f"the model has {params:,} parameters where the causal LM its config describes has {described_params:,} "
            "(adapters such as LoRA, another head, layers added or removed)")


def departure_note(why: str) -> str:
    """The run's note for a model that departs from its config (``why``: :func:`departure`'s clause)."""
    return (f"{why}: lmprof's formulas, and a model read off the meta device, describe the model its config builds, "
            "trained as built, not this one: its FLOPs are only those counted on a real step, and there is no "
            "memory estimate")
