"""Every described Hugging Face family decodes through its own KV cache, never a silent re-run.

transformers 5.24 renamed GPT-2's ``past_key_values`` argument to ``cache`` and lmprof, which then
looked for the old name in ``forward``'s signature, fell back to re-running the whole sequence per
token without an error. These tests hold the decoder to what a cache means, measured on the model
itself: the cache's tensors grow by the same number of bytes for every decoded token (the bytes the
prompt left, divided by its length), and one decode step costs the FLOPs of one new token
(FlopCounterMode, against the hand count of the matmuls for one token over T + 1 positions).
"""
from __future__ import annotations

import pytest

from lmprof.errors import ConfigError
from lmprof.workloads.decoding import HFDecoder, decoder_for
from test_models import FAMILIES, _matmul, build

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


@pytest.mark.parametrize("name", FAMILIES)
def test_family_decodes_through_its_cache(name: str) -> None:
    model, shape = build(name)
    decoder, notes = decoder_for(model.eval())
    assert isinstance(decoder, HFDecoder) and not notes
    B, T = 2, 6
    prompt = torch.randint(3, 100, (B, T))
    with torch.no_grad():
        decoder.start(prompt, T + 4)
        per_token = decoder.cache_bytes() / T
        assert per_token == int(per_token) and per_token > 0
        token = prompt[:, -1:]
        for k in range(1, 3):
            with FlopCounterMode(display=False) as fc:
                decoder.step(token)
            assert decoder.cache_bytes() == per_token * (T + k)
            assert fc.get_total_flops() == pytest.approx(_matmul(shape, "decode", B, T + k), rel=0.01)


def test_generation_model_without_a_cache_is_an_error(monkeypatch) -> None:
    model, _ = build("gpt2")
    decoder, _ = decoder_for(model.eval())
    forward = model.forward

    def no_cache(*args, **kwargs):  # a model that takes use_cache=True but hands back only its logits
        return {"logits": forward(*args, **kwargs).logits}

    monkeypatch.setattr(model, "forward", no_cache)
    with pytest.raises(ConfigError, match="returned no KV cache"), torch.no_grad():
        decoder.start(torch.randint(3, 100, (1, 4)), 8)


def test_plain_module_says_it_recomputes() -> None:
    decoder, notes = decoder_for(torch.nn.Linear(4, 4))
    assert not isinstance(decoder, HFDecoder)
    assert notes and "re-runs the whole sequence" in notes[0]
