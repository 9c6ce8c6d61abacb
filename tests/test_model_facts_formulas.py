"""lmprof's torch-free formulas against the describer, on every family the formulas cover.

Each family's tiny config (the shrunk table entries of tests/test_models.py and the distinguishing
layouts of tests/test_families.py) is described on the meta device with eager attention (the
formulas count attention's backward as 2 x its forward, the math path; the fused kernel's backward
recomputes the scores, 2.5 x). Parameters, active parameters, prefill, decode and training matmul
FLOPs and the cache after T tokens must be equal; the one documented difference is Llama 4's
experts, which transformers runs for every token (the unrouted ones scaled by 0) where the formulas
count the ``top_k`` a token is routed to (docs/flops-and-roofline.md).
"""
from __future__ import annotations

import pytest

from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.estimate.models import SUPPORTED, shape_from_config, shrunk_config

pytest.importorskip("transformers")
pytest.importorskip("torch")

from lmprof.measure.model_facts import describe  # noqa: E402
from test_families import BASE, TINY  # noqa: E402
from test_models import FAMILIES  # noqa: E402

ALL = FlopConventions(prefill_logits="all")
B, T = 1, 8


def _configs() -> dict[str, dict]:
    out = {name: shrunk_config(name) for name in FAMILIES}
    for name, extra in TINY.items():
        cfg = {**BASE, **extra}
        cfg.setdefault("model_type", name)
        out[name] = cfg
    return out


CONFIGS = _configs()


def test_every_formula_family_is_compared() -> None:
    assert set(SUPPORTED) == {cfg["model_type"] for cfg in CONFIGS.values()}


def _matmul(shape, phase: str, seq: int, context: int | None = None) -> float:
    return sum(c.matmul_flops for c in block_costs(shape, batch=B, seq_len=seq, phase=phase, dtype="fp32",
                                                   conventions=ALL, context=context))


def _unrouted(shape, tokens: int) -> int:
    """Llama 4: the E - top_k experts transformers runs with weight 0 for every token (by hand)."""
    if shape.family != "llama4_text":
        return 0
    return shape.n_moe_layers * 2 * tokens * 3 * shape.n_embd * shape.expert_ffn * (shape.n_experts - shape.top_k)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_formulas_equal_the_describer(name: str) -> None:
    cfg = dict(CONFIGS[name])
    shape = shape_from_config(cfg)
    facts = describe(cfg, batch=B, seq_len=T, memory=False, attention="eager",
                     phases=("prefill", "decode", "train"))
    assert facts.params == shape.n_params()
    assert facts.params_active == shape.n_params(active=True)
    assert facts.flops("prefill") - _unrouted(shape, B * T) == _matmul(shape, "prefill", T)
    assert facts.flops("train") - 3 * _unrouted(shape, B * T) == _matmul(shape, "forward", T) + _matmul(
        shape, "backward", T)
    assert facts.flops("decode") - _unrouted(shape, B) == _matmul(shape, "decode", T)  # attends T keys
    # The cache after the prefill of T tokens: the formulas' K/V (windows, latents) against the model's own.
    assert facts.cache_elements(T) == shape.kv_cache_elements(T)
