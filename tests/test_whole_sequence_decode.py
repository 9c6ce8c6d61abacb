"""A model that wants every token so far at each decode step gets it, as transformers' generate() gives it.

CPM-Ant's forward slices the cached prefix off itself (its ``prepare_inputs_for_generation`` keeps the
whole sequence), so a decode step fed only the new token failed with a shape error: `lmprof infer`
printed a traceback and the describer could not read its decode step. The truths here are
transformers' own: ``generate()``'s greedy tokens, and a decode step run on the CPU under torch's
FlopCounterMode (as the family walk counts: with the formula torch lacks for its CPU flash attention).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lmprof.measure.flops import flop_counter  # noqa: E402
from lmprof.measure.model_facts.describe import describe  # noqa: E402
from lmprof.measure.model_facts.tiny import tiny_config  # noqa: E402
from lmprof.workloads.decoding import HFDecoder, decoder_for  # noqa: E402
from lmprof.workloads.hf_interface import returned_cache, wants_whole_sequence  # noqa: E402


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(family)).eval()


def _greedy(decoder: HFDecoder, prompt: torch.Tensor, new: int) -> torch.Tensor:
    token = decoder.start(prompt, prompt.shape[1] + new).argmax(-1, keepdim=True)
    out = [token]
    for _ in range(new - 1):
        token = decoder.step(token).argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("family, whole", [("cpmant", True), ("gpt2", False), ("llama", False)])
def test_lmprofs_decoder_gives_generates_tokens(family: str, whole: bool) -> None:
    model = _model(family)
    decoder, notes = decoder_for(model)
    assert isinstance(decoder, HFDecoder) and not notes
    prompt = torch.randint(3, 100, (2, 6))
    new = 5
    with torch.no_grad():
        ours = _greedy(decoder, prompt, new)
        theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, pad_token_id=0)[:, prompt.shape[1]:]
    assert decoder.whole is whole
    assert torch.equal(ours, theirs)
    # a second generation through the same decoder: the answer is kept, the sequence starts again
    with torch.no_grad():
        assert torch.equal(_greedy(decoder, prompt, new), theirs)


def test_the_question_is_asked_with_the_cache() -> None:
    """With a cache, a model that slices by it takes one token; the answer never comes from a call
    without one (an old-style override keeps everything when it has no cache)."""
    model = _model("gpt2")
    ids = torch.randint(3, 100, (1, 5))
    with torch.no_grad():
        keyword, cache = returned_cache(model(input_ids=ids[:, :4], use_cache=True))
    assert wants_whole_sequence(model, ids, {keyword: cache}) is False
    assert wants_whole_sequence(torch.nn.Linear(2, 2), ids, {}) is False  # no such method: the new token


def test_the_describers_decode_step_is_the_cpu_ones() -> None:
    """The describer's decode FLOPs (meta device) equal FlopCounterMode's count of a real decode step
    fed as generate() feeds it, for CPM-Ant (the whole sequence) and GPT-2 (one token)."""
    for family in ("cpmant", "gpt2"):
        cfg = tiny_config(family)
        facts = describe(cfg, batch=1, seq_len=8, context=8, phases=("decode",), memory=False)
        model = _model(family)
        ids = torch.randint(3, 100, (1, 8))
        with torch.no_grad():
            keyword, cache = returned_cache(model(input_ids=ids[:, :7], use_cache=True))
            fed = ids if family == "cpmant" else ids[:, 7:]
            with flop_counter(by_module=False) as fc:
                model(input_ids=fed, use_cache=True, **{keyword: cache})
        assert sum(r.flops for r in facts.rows) == fc.get_total_flops() > 0, family
