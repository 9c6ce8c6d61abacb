"""generate() inside a training step (an RL loop's rollout: GRPO, PPO) is one row, ``generate``.

Found with a GRPO-shaped loop (each step: ``model.generate`` under no_grad for 8 tokens, then a
forward and backward on the sequences) under ``lmprof run``: the rollout's eight forwards were added
to the training forward's rows (``attn.sdpa`` forward 2.27 ms where the training forward's is 0.70),
and generate's own per-token work went to the ``loss`` row (3.34 ms of 17.98). A training step's
``generate()`` is now scoped as a step part of its own, with no forward scope and no block ranges
inside it.

Truths: the loop itself (one training forward a step: each forward block is called once a step) and
torch's trace (the row's profiled time is the duration of the generate range, step by step).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

import lmprof
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")


def test_a_training_steps_rollout_is_the_generate_row(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0)
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(1, 128, (2, 8))
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=2, steps=2, profile_steps=2) as prof:
        for _ in range(8):
            model.eval()
            with torch.no_grad():
                seq = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, min_new_tokens=6,
                                     do_sample=False)
            model.train()
            model(input_ids=seq, labels=seq).loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run.load(prof.folder)
    forward = {b.name: b.calls for b in run.blocks if b.phase == "forward"}
    assert forward["lm_head"] == 1 and forward["ln_f"] == 1, forward  # the rollout's 6 forwards are not the training's
    (row,) = [b for b in run.blocks if b.name == "generate" and b.phase == "step"]
    events = [e for e in json.load(gzip.open(Path(prof.folder) / "trace.json.gz"))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    spans = [e["dur"] for e in events if e["name"] == "lmprof:generate" and any(a <= e["ts"] < b for a, b in steps)]
    assert len(spans) == len(steps) == 2
    assert row.profiled_ms == pytest.approx(sum(spans) / len(steps) / 1e3, rel=1e-6)  # nothing of it elsewhere
    from lmprof.analysis.advice import advise

    assert "rollout_share" in [r.rule for r in advise(run)]  # the rollout is about 62% of this step
