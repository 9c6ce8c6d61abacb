"""generate() continuing from a cache passed in (transformers' cache re-use recipe: a system prompt cached
once, a multi-turn chat): the prefill runs only the prompt's last tokens.

Before, `lmprof run --infer` counted a whole prompt's prefill: 64 cached + 8 new tokens made the
generation's FLOPs 19.0 MFLOP where FlopCounterMode counts 3.8, and prefill throughput counted 72
tokens. lmprof's formulas have no prefill at an offset, so the prefill's compute figures are n/a, said
why; decode (whose context the cache does hold) stands. Truth: FlopCounterMode over the script's own
generate() and over its prefill forward alone; decode's share is their difference.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.record.catalogue import FLOPS_MODEL, MFU, PREFILL_TOKENS_PER_S, TTFT, cost_key
from script_truth import TINY_GPT2, run_with_truth

pytest.importorskip("transformers")

SCRIPT = TINY_GPT2 + """
from transformers import DynamicCache
prefix = torch.randint(1, 256, (1, 64))
with torch.no_grad():
    cache = DynamicCache(config=m.config)
    m(prefix, past_key_values=cache)  # the system prompt, cached once
    x = torch.cat([prefix, torch.randint(1, 256, (1, 8))], 1)
    def turn():
        return m.generate(x, past_key_values=copy.deepcopy(cache), max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    for i in range(5):
        turn()
    with FlopCounterMode(display=False) as whole:
        turn()
    with FlopCounterMode(display=False) as prefill:
        m(x[:, 64:], past_key_values=copy.deepcopy(cache), logits_to_keep=1)
open(sys.argv[1], "w").write(json.dumps(whole.get_total_flops() - prefill.get_total_flops()))
"""


def test_a_prefill_from_a_cache_gets_no_whole_prompt_flops(tmp_path: Path, cli) -> None:
    run, decode_truth = run_with_truth(cli, tmp_path, SCRIPT, "reuse", infer=True)
    for key in (FLOPS_MODEL, MFU):
        m = run.metrics[cost_key("prefill", key)]
        assert m.value is None and "64 came from a cache passed to generate()" in (m.note or "")
    # decode's formulas: within the 2% of non-matmul FLOPs FlopCounterMode leaves out (as for any generate())
    assert 1.0 <= run.metrics[cost_key("decode", FLOPS_MODEL)].value / decode_truth < 1.02
    # prefill throughput: the 8 tokens the prefill ran, over its time
    assert run.metrics[PREFILL_TOKENS_PER_S].value == pytest.approx(8 / (run.metrics[TTFT].value / 1000), rel=0.1)
    assert all(b.flops is None for b in run.blocks if b.phase == "prefill")
