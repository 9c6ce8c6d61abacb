"""generate() that runs more rows than it was given prompts: beam search (``num_beams`` rows a prompt) and
several sequences a prompt (``num_return_sequences``).

Before, `lmprof run --infer` took the batch from the prompt generate() was called with: 2 prompts with
4 beams got the FLOPs of 2 rows where the forwards ran 8 (45.6 MFLOP by FlopCounterMode, 12.1 said),
and so their bytes, MFU and KV-cache estimate. Now the prefill's own input says the rows; output
throughput counts the sequences returned. Truth: FlopCounterMode over one generate() of the script's,
eager attention (CPU SDPA is not counted by it); lmprof's count of a greedy generate() is its formulas',
1.6% over FlopCounterMode's on this 2-layer GPT-2 (non-matmul FLOPs), so the expanded ones must sit at
that same ratio.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmprof.record.catalogue import E2E_LATENCY, FLOPS_MODEL, OUTPUT_TOKENS_PER_S, TOTAL_TOKENS_PER_S, cost_key
from lmprof.record.run import Run
from script_truth import TINY_GPT2, run_with_truth

pytest.importorskip("transformers")

SCRIPT = TINY_GPT2 + """
x = torch.randint(1, 256, (2, 16))
kw = dict(max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
kw.update(json.loads(sys.argv[2]))
with torch.no_grad():
    # the prompt as token ids, or as their embeddings (a multimodal or prompt-tuning caller's generate())
    prompt = {"inputs_embeds": m.get_input_embeddings()(x)} if kw.pop("embeds", False) else {"input_ids": x}
    for i in range(5):
        out = m.generate(**prompt, **kw)
    with FlopCounterMode(display=False) as fc:
        out = m.generate(**prompt, **kw)
open(sys.argv[1], "w").write(json.dumps({"flops": fc.get_total_flops(), "rows": out.shape[0]}))
"""


def _generate(tmp_path: Path, cli, name: str, **kw: object) -> tuple[Run, dict]:
    return run_with_truth(cli, tmp_path, SCRIPT, name, json.dumps(kw), infer=True)


def _flops(run: Run) -> float:
    return sum(run.metrics[cost_key(p, FLOPS_MODEL)].value for p in ("prefill", "decode"))


def test_beams_and_several_sequences_count_the_rows_the_forwards_ran(tmp_path: Path, cli) -> None:
    greedy, g_truth = _generate(tmp_path, cli, "greedy")
    ratio = _flops(greedy) / g_truth["flops"]
    assert 1.0 <= ratio < 1.02
    beams, b_truth = _generate(tmp_path, cli, "beams", num_beams=4, early_stopping=False)
    several, s_truth = _generate(tmp_path, cli, "several", do_sample=True, num_return_sequences=3)
    for run, truth, returned in ((beams, b_truth, 2), (several, s_truth, 6)):
        assert _flops(run) / truth["flops"] == pytest.approx(ratio, rel=1e-3)
        assert truth["rows"] == returned
        # the sequences returned, 12 new tokens each, over the whole generation's time
        per_s = returned * 12 / (run.metrics[E2E_LATENCY].value / 1000)
        assert run.metrics[OUTPUT_TOKENS_PER_S].value == pytest.approx(per_s, rel=0.05)
        # total tokens: the 2 prompts' 16 tokens once (not per beam or per sequence), and what came back, over
        # each generation's same time as output's: the two medians stand in that ratio exactly, however loaded
        tokens = (2 * 16 + returned * 12) / (returned * 12)
        assert run.metrics[TOTAL_TOKENS_PER_S].value == pytest.approx(tokens * run.metrics[OUTPUT_TOKENS_PER_S].value,
                                                                      rel=1e-9)
        assert [n for n in run.notes if n.startswith(f"generate() ran its forwards on {8 if run is beams else 6} rows "
                                                     f"for 2 prompt(s) and returned {returned} sequence(s)")], run.notes
    assert not [n for n in greedy.notes if "rows for" in n]


def test_a_prompt_of_embeddings_has_its_flops(tmp_path: Path, cli) -> None:
    """``generate(inputs_embeds=...)``: no token ids, and the run had no FLOP count ("saw no forward's input");
    the embeddings' (batch, length) are the prompt's. Truth: greedy's ratio to FlopCounterMode, as above."""
    greedy, g_truth = _generate(tmp_path, cli, "greedy")
    embeds, e_truth = _generate(tmp_path, cli, "embeds", embeds=True)
    assert _flops(embeds) / e_truth["flops"] == pytest.approx(_flops(greedy) / g_truth["flops"], rel=1e-3)
    assert not [n for n in embeds.notes if "rows for" in n]
