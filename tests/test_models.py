"""The model description against independent truths: transformers' own models and FlopCounterMode.

For a shrunk random-weight instance of every family in the shipped table, the parameter count
equals the built model's and the analytic matmul FLOPs equal FlopCounterMode's for a training
forward + backward, a prefill (logits at every position, as Hugging Face computes them) and one
decode step against the cache. Eager attention and eager experts are used because FlopCounterMode
has no formula for the CPU SDPA kernel or grouped expert matmuls.
"""
from __future__ import annotations

from dataclasses import astuple

import pytest

from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.errors import ConfigError
from lmprof.measure.flops import count_causal_lm_flops
from lmprof.estimate.dropout import dropout_from_config
from lmprof.estimate.models import known_config, known_models, resolve_model, shape_from_config, shrunk_config

tf = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

# One table entry per family (and per variant that changes the layout).
FAMILIES = ["gpt2", "llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen2.5-0.5b", "qwen2.5-7b",
            "gemma-2-2b", "phi-3-mini-4k", "pythia-160m", "opt-125m", "falcon-7b", "falcon-40b"]
ALL = FlopConventions(prefill_logits="all")
tiny_config = shrunk_config


def build(name: str):
    cfg = tiny_config(name)
    hc = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    kw = {"experts_implementation": "eager"} if hc.model_type in ("mixtral", "qwen2_moe") else {}
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(hc, attn_implementation="eager", **kw)
    return model, shape_from_config(hc.to_dict())


def _matmul(shape, phase: str, batch: int, seq: int) -> float:
    return sum(c.matmul_flops for c in block_costs(shape, batch=batch, seq_len=seq, phase=phase, dtype="fp32",
                                                   conventions=ALL))


@pytest.mark.parametrize("name", FAMILIES)
def test_family_params_and_flops_match_transformers(name: str) -> None:
    model, shape = build(name)
    assert shape.n_params() == sum(p.numel() for p in model.parameters())
    B, T = 2, 12
    train, prefill, decode = astuple(count_causal_lm_flops(model, torch.randint(3, 128, (B, T))))
    assert train == pytest.approx(_matmul(shape, "forward", B, T) + _matmul(shape, "backward", B, T), rel=0.01)
    assert prefill == pytest.approx(_matmul(shape, "prefill", B, T), rel=0.01)
    assert decode == pytest.approx(_matmul(shape, "decode", B, T + 1), rel=0.01)


@pytest.mark.parametrize("name", known_models())
def test_table_matches_published_counts(name: str) -> None:
    """Every published figure of the table, from the formulas or, for a family they do not know, from the
    model built at full size on the meta device (the describer: parameters only, no pass run)."""
    from lmprof.measure.model_facts import describe

    entry = resolve_model(name)
    rel = entry.published_tolerance
    assert rel <= 0.02
    assert entry.source.startswith("https://huggingface.co/") and entry.source.endswith("/config.json")
    if entry.figures == "model":
        facts = describe(entry.config, phases=())
        if entry.published_params:
            assert facts.params == pytest.approx(entry.published_params, rel=rel)
        assert not entry.published_active_params  # the flagships publish rounded active counts ("A3B")
        return
    if entry.published_params:
        assert entry.shape.n_params() == pytest.approx(entry.published_params, rel=rel)
    if entry.published_active_params:
        assert entry.active_params_as_published() == pytest.approx(entry.published_active_params, rel=rel)


def test_hand_checks_llama3_and_mixtral() -> None:
    llama = resolve_model("llama-3-8b").shape
    # 7.50 B weights in matmuls (lm_head in, input embedding out): 2 FLOPs each per token.
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert llama.matmul_weights() == 32 * per_layer + 128256 * 4096 == 7_504_658_432
    assert llama.n_params() == 8_030_261_248
    fwd = sum(c.matmul_flops for c in block_costs(llama, batch=1, seq_len=1, phase="decode", context=1))
    assert fwd / 1e9 == pytest.approx(15.01, abs=0.01)
    mix = resolve_model("Mixtral-8x7B").shape
    assert mix.n_params() / 1e9 == pytest.approx(46.70, abs=0.01)
    assert mix.n_params(active=True) / 1e9 == pytest.approx(12.88, abs=0.01)


@pytest.mark.parametrize("bad", ["no-such-model", ""])
def test_unknown_model_lists_supported(bad: str) -> None:
    with pytest.raises(ConfigError, match="llama-3-8b" if bad else "empty"):
        resolve_model(bad)


def test_unsupported_architecture(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "t5", "hidden_size": 8}')
    with pytest.raises(ConfigError, match="encoder-decoder.*causal LMs .*docs/families.md"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="unsupported architecture 't5'"):
        shape_from_config({"model_type": "t5"})


def test_bert_is_described_as_the_causal_lm_transformers_builds(tmp_path) -> None:
    """BERT's config (bert-base's defaults) was refused as 'encoder-only' by the estimate verbs while
    `lmprof train --hf-config` ran it: transformers builds it as BertLMHeadModel, so its figures come
    from that model. Truth: the parameters of the model transformers builds from the same file."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from lmprof.measure.model_facts import describe

    cfg = transformers.BertConfig()
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    entry = resolve_model(str(tmp_path))
    assert entry.figures == "model" and entry.shape is None
    with torch.device("meta"):
        real = transformers.AutoModelForCausalLM.from_config(cfg)
    facts = describe(entry.config, batch=1, seq_len=8, phases=("prefill",), memory=False)
    assert facts.params == sum(p.numel() for p in real.parameters())


def test_hf_gpt2_prefill_model_flops_count_every_position() -> None:
    """Issue 13 §2: a Hugging Face prefill computes logits at all 32 prompt positions (7.94 GFLOP)."""
    from lmprof.estimate.flops import conventions_for, model_flops_per_step
    from lmprof.workloads.hf import shape_of

    hc = tf.AutoConfig.for_model("gpt2")
    # On the meta device: FlopCounterMode counts from shapes alone (the same 7.944 GFLOP as with real
    # weights), and building GPT-2's 124 M random weights took 3.2 s of the test's 3.4 s.
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(hc, attn_implementation="eager").eval()
    shape = shape_of(model)
    assert shape is not None and conventions_for(shape).prefill_logits == "all"
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(input_ids=torch.randint(0, 50257, (1, 32), device="meta"), use_cache=True)
    counted = model_flops_per_step(shape, batch=1, seq_len=32, mode="prefill", conventions=conventions_for(shape))
    assert fc.get_total_flops() / 1e9 == pytest.approx(7.94, abs=0.01)
    assert counted == pytest.approx(fc.get_total_flops(), rel=0.01)


def _measured_train_memory(name: str, B: int = 4, T: int = 48, dropout: float | None = None):
    """A measured CPU training step of the family's shrunk instance, with its dropout as transformers
    configures it (GPT-2: 0.1 on embeddings, probabilities and branches; OPT: 0.1 on branches), or
    with every dropout the family has at ``dropout``."""
    from lmprof.workloads.training import plain_train_step
    from memory_step import measure_step_memory

    cfg = tiny_config(name)
    if dropout is not None:
        for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout"):
            cfg[k] = dropout
    hc = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    kw = {"experts_implementation": "eager"} if hc.model_type in ("mixtral", "qwen2_moe") else {}
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(
        hc, attn_implementation="eager" if hc.model_type == "gemma2" else "sdpa", **kw).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step = plain_train_step(model, opt, lambda: torch.randint(3, 128, (B, T)),
                            lambda m, x: m(input_ids=x, labels=x).loss)
    measured = measure_step_memory(step, model, opt, "cpu", warmup=1)
    return measured, shape_from_config(hc.to_dict()), B, T, dropout_from_config(hc.to_dict())


@pytest.mark.parametrize("bt", [(4, 48), (2, 40)])
@pytest.mark.parametrize("name", FAMILIES)
def test_family_training_memory_matches_measured_cpu(name: str, bt: tuple[int, int]) -> None:
    """Parameter, gradient, AdamW, activation and peak bytes of every family, dropout as configured,
    within 3% of a measured CPU step, except Mixtral's peak (its 3-D expert weights' gradients are
    built per expert in backward; the estimate counts both copies, an upper bound 3-5% above)."""
    from lmprof.estimate.memory import HF_ITEMIZED, estimate_memory

    measured, shape, B, T, drop = _measured_train_memory(name, *bt)
    est = estimate_memory(shape, batch=B, seq_len=T, mode="train", dtype="fp32", param_dtype="fp32",
                          attention="sdpa", device_kind="cpu", dropout=drop)
    for key, value in (("params", est.params), ("grads", est.grads), ("optimizer", est.optimizer_state)):
        assert measured.value(key)[0] == pytest.approx(value, rel=0.03), key
    assert shape.family in HF_ITEMIZED
    assert measured.value("activations")[0] == pytest.approx(est.activations, rel=0.03)
    if shape.family != "mixtral":
        assert measured.value("peak")[0] == pytest.approx(est.peak, rel=0.03)
    else:  # an upper bound (both copies of a layer's expert gradients): never under, within 10%
        assert est.peak >= measured.value("peak")[0] >= 0.9 * est.peak


@pytest.mark.parametrize("name", FAMILIES)
def test_family_training_memory_with_every_dropout_on(name: str) -> None:
    """Every dropout a family has at 0.1: its masks are counted and, where the probabilities are
    dropped, SDPA's math kernel (the CPU's path) is itemized. Activations within 3% of a measured CPU
    step, the peak within 3% (Mixtral: an upper bound within 10%, see above)."""
    from lmprof.estimate.memory import estimate_memory

    measured, shape, B, T, drop = _measured_train_memory(name, 4, 48, dropout=0.1)
    assert drop.any
    est = estimate_memory(shape, batch=B, seq_len=T, attention="sdpa", device_kind="cpu", dropout=drop)
    assert est.attention_path == ("math" if drop.attention else "fused")
    assert measured.value("activations")[0] == pytest.approx(est.activations, rel=0.03)
    if shape.family == "mixtral":
        assert est.peak >= measured.value("peak")[0] >= 0.9 * est.peak
    else:
        assert measured.value("peak")[0] == pytest.approx(est.peak, rel=0.03)


def test_config_json_and_folder_resolve_like_the_table(tmp_path) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps(known_config("mixtral-8x7b")))
    by_name = resolve_model("mixtral-8x7b").shape
    for spec in (str(tmp_path), str(tmp_path / "config.json")):
        shape = resolve_model(spec).shape
        assert shape.n_params() == by_name.n_params() and shape.n_params(active=True) == by_name.n_params(active=True)
    with pytest.raises(Exception, match="no config.json"):
        resolve_model(str(tmp_path / "missing"))
