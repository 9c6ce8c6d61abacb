"""A model trained by several optimizers at once: Muon for its hidden matrices, AdamW for the rest, as
modded-nanogpt and Kimi's recipes do (``torch.optim.Muon`` is in torch).

Before, `lmprof run` counted only the largest optimizer: on a 2-layer GPT-2 the run's optimizer state
was Muon's 384 KiB of the 558 KiB the two held, AdamW's step fell in 'other (step)', and the memory
estimate was AdamW-less Muon's refusal, by chance right. Truth: the optimizers' own state tensors (read
by the script at its end) and torch's own ``Optimizer.step#...`` events in the run's trace.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lmprof.record.catalogue import memory_key
from lmprof.record.run import Run
from script_truth import run_with_truth

pytest.importorskip("transformers")

SCRIPT = """
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                               bos_token_id=0, eos_token_id=0))
hidden = [p for n, p in m.named_parameters() if p.ndim == 2 and ".h." in n]
rest = [p for n, p in m.named_parameters() if not (p.ndim == 2 and ".h." in n)]
first = torch.optim.Muon(hidden, lr=0.02) if sys.argv[2] == "muon" else torch.optim.AdamW(hidden, lr=1e-3)
opts = [first, torch.optim.AdamW(rest, lr=1e-3, weight_decay=0.0)]
x = torch.randint(0, 256, (4, 32))
for i in range(12):
    m(x, labels=x).loss.backward()
    for o in opts:
        o.step()
    for o in opts:
        o.zero_grad(set_to_none=True)
state = sum(t.numel() * t.element_size() for o in opts for s in o.state.values() for t in s.values()
            if isinstance(t, torch.Tensor))
open(sys.argv[1], "w").write(json.dumps(state))
"""


def _run(tmp_path: Path, cli, first: str) -> tuple[Run, int, list[dict]]:
    run, state = run_with_truth(cli, tmp_path, SCRIPT, first, first, warmup=2, steps=3, profile_steps=2)
    with gzip.open(tmp_path / f"runs-{first}" / run.id / "trace.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    return run, state, events


def test_every_optimizer_of_the_model_is_counted(tmp_path: Path, cli) -> None:
    run, state, events = _run(tmp_path, cli, "muon")
    assert run.metrics[memory_key("optimizer")].value == state  # Muon's momentum and AdamW's two moments
    # every optimizer step torch recorded holds one of lmprof's 'optimizer' ranges: torch's step hooks, which
    # open and close it, run inside torch's own range of the step
    scopes = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "lmprof:optimizer"]
    steps = [e for e in events if e["name"].startswith("Optimizer.step#")]
    assert {e["name"] for e in steps} == {"Optimizer.step#Muon.step", "Optimizer.step#AdamW.step"}
    for e in steps:
        assert any(e["ts"] <= a and b <= e["ts"] + e["dur"] for a, b in scopes), e["name"]
    assert [n for n in run.notes if n.startswith("2 optimizers: steps end at the largest's, Muon")], run.notes
    assert [n for n in run.notes if n.startswith("no memory estimate for optimizer 'muon+adamw'")], run.notes


def test_two_adamws_keep_the_memory_estimate(tmp_path: Path, cli) -> None:
    """Two optimizers of one class (AdamW per group of weights) are that optimizer for the estimate."""
    run, state, _ = _run(tmp_path, cli, "adamw")
    assert run.metrics[memory_key("optimizer")].value == state
    estimated = run.metrics[memory_key("optimizer", estimated=True)].value
    assert estimated is not None and abs(estimated - state) <= 0.01 * state  # 2 fp32 moments a parameter
