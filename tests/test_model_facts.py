"""The describer against independent truths: the real random-weight model on the CPU.

Tiny configs from the one shared recipe (``model_facts.tiny``). Truths: ``sum(numel)`` of the real
model's parameters; lmprof's FlopCounterMode (torch's formulas, plus the CPU's SDPA kernels and
grouped expert matmuls) over the real model's prefill and training step; the bytes of the cache
tensors the real model returns; the real model's expert tensors for active parameters.
The full walk over every registered family is scripts/family_walk.py (docs/families.md).
"""
from __future__ import annotations

import pytest

from lmprof.errors import ConfigError

tf = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from lmprof.measure.flops import flop_counter  # noqa: E402
from lmprof.measure.model_facts import describe  # noqa: E402
from lmprof.measure.model_facts.tiny import tiny_config  # noqa: E402
from lmprof.workloads.hf_interface import cache_bytes, require_cache  # noqa: E402

B, T = 1, 8
# One family per kind of layer: dense with learned positions and LayerNorm (gpt2), routed experts
# (qwen3_moe), latent attention with experts (deepseek_v3), linear attention + attention with experts
# (qwen3_next), SSM + attention in one layer (falcon_h1), convolution + attention (lfm2).
FAMILIES = ["gpt2", "qwen3_moe", "deepseek_v3", "qwen3_next", "falcon_h1", "lfm2"]


def config(name: str):
    cfg = tiny_config(name)
    if name == "lfm2":  # transformers' default LFM2 config attends in every layer; LFM2's models mix convolutions in
        cfg.layer_types, cfg.full_attn_idxs = ["conv", "full_attention", "conv", "full_attention"], [1, 3]
    return cfg


def _real(name: str):
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config(name))


@pytest.mark.parametrize("name", FAMILIES)
def test_params_and_flops_equal_the_real_model(name: str) -> None:
    facts = describe(config(name), batch=B, seq_len=T, memory=False, phases=("prefill", "train"))
    model = _real(name)
    ids = torch.randint(3, 100, (B, T))
    assert facts.params == sum(p.numel() for p in model.parameters())
    model.eval()
    with torch.no_grad(), flop_counter() as fc:
        model(input_ids=ids, use_cache=True)
    assert facts.flops("prefill") == fc.get_total_flops()
    model.train()
    with flop_counter() as fc:
        model(input_ids=ids, labels=ids).loss.backward()
    assert facts.flops("train") == fc.get_total_flops()
    # Every FLOP is some block's: rows of the right phases, none charged to the whole model.
    assert {r.phase for r in facts.rows} == {"prefill", "forward", "backward"}
    assert not [r for r in facts.rows if r.name in ("model_glue", "(unscoped)") and r.flops]


@pytest.mark.parametrize("name", ["diffllama", "xlnet"])
def test_a_parameter_built_off_the_meta_device_is_moved_onto_it(name: str) -> None:
    """DiffLlama's lambdas (torch.normal(mean, std, size)) and XLNet's embeddings come out of a factory the
    meta device context does not reach: built on the CPU, their backward on meta failed. Moved onto meta, the
    training step's FLOPs equal the real model's (forward and backward, counted on the CPU)."""
    from lmprof.measure.model_facts.meta import build_on_meta

    with torch.device("meta"):  # as the describer builds: the stragglers are the model's own doing
        stray = [n for n, p in tf.AutoModelForCausalLM.from_config(config(name)).named_parameters() if not p.is_meta]
    assert stray  # the case this test is about
    assert all(p.is_meta for p in build_on_meta(config(name)).parameters())
    facts = describe(config(name), batch=B, seq_len=T, memory=False, phases=("train",))
    model = _real(name).train()
    ids = torch.randint(3, 100, (B, T))
    with flop_counter() as fc:
        model(input_ids=ids, labels=ids).loss.backward()
    assert facts.flops("train") == fc.get_total_flops()


@pytest.mark.parametrize("name", ["qwen3_next", "falcon_h1", "lfm2", "deepseek_v3"])
def test_cache_equals_the_real_models_cache(name: str) -> None:
    """After a prefill of T tokens and one decode step, what the describer says the cache holds (attention
    KV, latent KV, conv and SSM / linear-attention states) equals the bytes of the real model's cache."""
    facts = describe(config(name), batch=2, seq_len=T, context=T + 1, memory=False, phases=("prefill",))
    model = _real(name).eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(3, 100, (2, T)), use_cache=True)
        key, cache = require_cache(model, out)
        out = model(input_ids=torch.randint(3, 100, (2, 1)), use_cache=True, **{key: cache})
    assert facts.cache_bytes(2, T + 1) == cache_bytes(require_cache(model, out)[1])
    kinds = set(facts.cache_by_kind(T))
    assert kinds == {"qwen3_next": {"attention KV", "conv state", "linear-attention state"},
                     "falcon_h1": {"attention KV", "conv state", "SSM state"},
                     "lfm2": {"attention KV", "conv state"}, "deepseek_v3": {"latent KV"}}[name]


def test_active_params_scale_routed_experts_keep_shared_ones() -> None:
    """qwen3_next: routed experts count top_k / n_experts of their tensors, the shared expert whole."""
    facts = describe(config("qwen3_next"), batch=1, seq_len=4, memory=False, phases=("prefill",))
    model = _real("qwen3_next")
    cfg = model.config
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    shared = sum(p.numel() for n, p in model.named_parameters() if "shared_expert" in n)
    assert routed and shared
    unused = routed * (cfg.num_experts - cfg.num_experts_per_tok) // cfg.num_experts
    assert facts.params_active == facts.params - unused


def test_decode_goes_through_the_models_own_cache() -> None:
    """One decode step costs one token's work: its FLOPs are the prefill's of one token, not a re-run."""
    one = describe(config("lfm2"), batch=1, seq_len=1, memory=False, phases=("prefill",))
    step = describe(config("lfm2"), batch=1, seq_len=1, context=T + 1, memory=False, phases=("decode",))
    prefill = describe(config("lfm2"), batch=1, seq_len=T + 1, memory=False, phases=("prefill",))
    # The attention of the decoded token reads T + 1 keys; everything else is one token's.
    assert one.flops("prefill") < step.flops("decode") < prefill.flops("prefill") / 4
    assert {r.name for r in step.rows} >= {"conv.in_proj", "conv.core", "conv.out_proj", "attn.qkv", "attn.sdpa"}


def test_a_model_the_describer_cannot_build_is_one_line() -> None:
    for cfg, why in (({"model_type": "no_such_family"}, "cannot read"), ({"model_type": "t5"}, "not a causal"),
                     ({}, "no model_type"), ({"model_type": "llama", "num_hidden_layers": 10**6}, "between 1 and 4,096"),
                     ({"model_type": "llama", "hidden_size": "64"}, "whole number")):
        with pytest.raises(ConfigError, match=why) as err:
            describe(cfg, batch=1, seq_len=4)
        assert "\n" not in str(err.value)


def test_each_pass_and_layer_is_told_to_progress() -> None:
    """A model read off meta says which pass runs and how many of its layers are done (a full-size Jamba's
    training memory takes minutes there): every pass asked for, layers counted against the config's."""
    from lmprof import progress

    seen = []
    with progress.listening(seen.append):
        describe(config("gpt2"), batch=1, seq_len=4, phases=("prefill", "train"))
    stages = [e.stage for e in seen]
    n = tiny_config("gpt2").n_layer
    for what in ("prefill", "training step", "training step at batch 2"):
        assert any(s.startswith(f"gpt2's {what} ") and "on the meta device" in s for s in stages), (what, stages)
    assert any(s.endswith(": backward") for s in stages)
    layer_events = [e for e in seen if e.stage.endswith("layers done")]
    assert {e.total for e in layer_events} == {n} and {e.done for e in layer_events} == set(range(n))
