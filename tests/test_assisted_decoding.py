"""Assisted (speculative) decoding under ``lmprof run --infer``: a draft model proposes tokens and the
model checks several in one forward, so forwards are not tokens.

Before, lmprof counted one token a forward: 8 tokens made in 4 forwards read as 4 new tokens, output
throughput half the truth, TPOT the time of a forward. Truth: the script's own count of the tokens
generate() returned.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmprof.record.run import Run
from tests.test_usercode import lmprof_run, write

pytest.importorskip("transformers")

SCRIPT = """
import json, sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.set_num_threads(1)
cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0,
                 pad_token_id=0)
torch.manual_seed(0)
model, draft = GPT2LMHeadModel(cfg).eval(), GPT2LMHeadModel(cfg).eval()
ids = torch.randint(1, 256, (1, 12))
times, tokens = [], []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                         do_sample=False, pad_token_id=0, assistant_model=draft)
    times.append(time.perf_counter() - t)
    tokens.append(out.shape[1] - ids.shape[1])
json.dump({"times": times, "tokens": tokens}, open(sys.argv[1], "w"))
"""


def test_tokens_are_what_generate_returned_not_forwards(tmp_path: Path) -> None:
    script = write(tmp_path, "assisted.py", SCRIPT)
    code, folder = lmprof_run(tmp_path, "--infer", "--profile-steps", 1, script, tmp_path / "own.json", 10)
    assert code == 0 and folder is not None
    own = json.loads((tmp_path / "own.json").read_text())
    run = Run.load(folder)
    assert run.config["new_tokens"] == own["tokens"][-1] == 8
    assert any(n.startswith("several tokens per forward: each generation made 8 tokens") for n in run.notes)
    # output throughput: 8 tokens over each clean generation's time (batch 1; the median of 5 is one of them)
    ttft, tpot, e2e = (run.value(k) for k in ("ttft", "tpot", "e2e_latency"))
    assert run.value("output_tokens_per_s") == pytest.approx(8 / (e2e / 1e3), rel=1e-9)
    # TPOT: the decode time per token after the first, so TTFT + 7 TPOT make up a generation (medians of
    # different generations: as loose as tests/test_usercode.py's generate() check)
    assert ttft + 7 * tpot == pytest.approx(e2e, rel=0.35)
    hfu = run.metrics["decode.hfu"]
    assert hfu.value is None and "draft model" in (hfu.note or "")
