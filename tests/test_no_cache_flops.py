"""Decode without a KV cache: the hardware FLOPs are the recomputation that ran, not a cached step.

Each decode step of `lmprof infer --no-kv-cache` runs the model over the whole sequence so far. The
hardware FLOPs (decode HFU) said "model FLOPs, no recomputation" and counted one cached step per
token, 5-11x under what ran; the model FLOPs (MFU) keep counting the new tokens' work, so MFU
against HFU shows what the missing cache costs. The truth is torch's FlopCounterMode over the same
decoder's steps, run here apart from lmprof's run.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lmprof.config import InferConfig  # noqa: E402
from lmprof.measure.flops import flop_counter  # noqa: E402
from lmprof.pipeline.infer import run_inference  # noqa: E402
from lmprof.workloads.decoding import decoder_for  # noqa: E402

B, PROMPT, NEW = 2, 8, 6


def _decode_flops(model: torch.nn.Module) -> int:
    """FlopCounterMode's count of NEW - 1 decode steps without a cache after a PROMPT-token prompt."""
    decoder, _ = decoder_for(model.eval(), kv_cache=False)
    with torch.no_grad():
        token = decoder.start(torch.randint(3, 60, (B, PROMPT)), PROMPT + NEW).argmax(-1, keepdim=True)
        with flop_counter(by_module=False) as fc:
            for _ in range(NEW - 1):
                token = decoder.step(token).argmax(-1, keepdim=True)
    return int(fc.get_total_flops())


def _cfg(**kw) -> InferConfig:
    return InferConfig(batch_size=B, prompt_len=PROMPT, new_tokens=NEW, steps=1, warmup=1, profile_steps=1,
                       device="cpu", energy="off", kv_cache=False, **kw)


def test_builtin_gpt_without_a_cache(tmp_path) -> None:
    from lmprof.workloads.gpt import GPT, preset

    run, _ = run_inference(_cfg(n_layer=2), out_dir=tmp_path / "r")
    m = run.metrics
    truth = _decode_flops(GPT(preset("tiny", n_layer=2)))
    assert m["decode.flops.hardware_per_step"].value == pytest.approx(truth, rel=0.01)
    assert "re-runs the whole sequence" in m["decode.flops.hardware_per_step"].note
    # the new tokens' work is what a cached step does: far below what ran
    assert m["decode.flops.model_per_step"].value < truth / 3
    assert m["decode.hfu"].value > 3 * m["decode.mfu"].value
    assert any(n.startswith("no KV cache: every decode step re-ran") for n in run.notes)
    from lmprof.show.summary import shown_keys

    assert "decode.hfu" in shown_keys(run)  # on screen beside MFU when they differ
    # the prefill is one forward either way
    assert m["prefill.flops.hardware_per_step"].value == m["prefill.flops.model_per_step"].value


def test_a_described_model_without_a_cache_takes_the_count(tmp_path) -> None:
    """A family lmprof reads off the model (OLMo): the hardware FLOPs are FlopCounterMode's count of
    a generation's decode steps, taken on a warm-up generation, equal to this test's own count."""
    transformers = pytest.importorskip("transformers")
    from lmprof.measure.model_facts.tiny import tiny_config

    cfg = tiny_config("olmo")
    path = tmp_path / "olmo.json"
    path.write_text(cfg.to_json_string())
    run, _ = run_inference(_cfg(hf_config=str(path)), out_dir=tmp_path / "r")
    m = run.metrics
    truth = _decode_flops(transformers.AutoModelForCausalLM.from_config(cfg))
    assert m["decode.flops.hardware_per_step"].value == truth
    assert "FlopCounterMode's count" in m["decode.flops.hardware_per_step"].note
    assert m["decode.hfu"].value > 3 * m["decode.mfu"].value


def test_with_a_cache_nothing_changes(tmp_path) -> None:
    from lmprof.estimate.mfu import mfu_metrics
    from lmprof.estimate.models import resolve_model

    shape = resolve_model("gpt2").shape
    assert shape is not None
    kw = dict(batch=1, seq_len=32, mode="decode", time_s=1.0, device_name="h100", decode_tokens=10, peak=None)
    cached = mfu_metrics(shape, **kw)
    assert cached["flops.hardware_per_step"].value == cached["flops.model_per_step"].value
    assert cached["flops.hardware_per_step"].note == "model FLOPs, no recomputation"
    recomputed = mfu_metrics(shape, **kw, kv_cache=False)
    assert recomputed["flops.model_per_step"].value == cached["flops.model_per_step"].value
    assert recomputed["flops.hardware_per_step"].value > 10 * cached["flops.hardware_per_step"].value


def test_users_generate_without_a_cache_is_seen_as_such(tmp_path) -> None:
    """A user's generate(use_cache=False) under lmprof.profile: the decode forwards' inputs grow and
    hand back no cache, so the run knows it recomputed. Truth: FlopCounterMode over one such
    generate() call, less its prefill (the first forward, counted by a hook of the model)."""
    transformers = pytest.importorskip("transformers")
    import lmprof
    from lmprof.record.run import Run

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=128, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)).eval()

    x = torch.randint(1, 256, (B, PROMPT))
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    runs = {}
    for cache in (False, True):
        m = model()
        with lmprof.profile(m, out=tmp_path / str(cache), infer=True, warmup=2, steps=2, profile_steps=1,
                            report=False, verbose=False) as prof:
            for _ in range(6):
                m.generate(x, use_cache=cache, **kw)
                prof.step()
        runs[cache] = Run.load(prof.folder)  # type: ignore[arg-type]

    m, per_forward = model(), []
    m.register_forward_pre_hook(lambda mod, args, kwargs: per_forward.append(fc.get_total_flops()), with_kwargs=True)
    with torch.no_grad(), flop_counter(by_module=False) as fc:
        m.generate(x, use_cache=False, **kw)
    decode_truth = fc.get_total_flops() - per_forward[1]  # all but the first forward's
    recomputed, cached = runs[False].metrics, runs[True].metrics
    # generate() asks for the prefill's last logits only (logits_to_keep=1): the run counts what its
    # output showed, not GPT-2's lm_head at every prompt position
    assert recomputed["prefill.flops.model_per_step"].value == pytest.approx(per_forward[1], rel=0.01)
    assert recomputed["decode.flops.hardware_per_step"].value == pytest.approx(decode_truth, rel=0.01)
    assert recomputed["decode.hfu"].value > 3 * recomputed["decode.mfu"].value
    assert any(n.startswith("no KV cache: every decode step re-ran") for n in runs[False].notes)
    # with its cache, the same figures as before: HFU == MFU, no such note
    assert cached["decode.flops.hardware_per_step"].value == cached["decode.flops.model_per_step"].value
    assert not any(n.startswith("no KV cache") for n in runs[True].notes)
    from lmprof.show.summary import shown_keys

    assert "decode.hfu" not in shown_keys(runs[True]) and "decode.hfu" in shown_keys(runs[False])
