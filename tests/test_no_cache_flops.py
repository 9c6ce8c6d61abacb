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
