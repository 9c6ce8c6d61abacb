"""`lmprof run --infer` on a model with its own generate method (nanoGPT's sample.py, minGPT): each call is
a generation, as a Hugging Face generate() is. Before: "the script ended without calling generate():
nothing measured". Truth: the script's own stopwatch around each generate() call."""
from __future__ import annotations

import statistics

import pytest
import torch

SAMPLE = """
import json, sys, time, torch, torch.nn as nn, torch.nn.functional as F
class GPT(nn.Module):
    def __init__(self, V=128, d=32, T=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, V, bias=False)
    def forward(self, idx):
        return self.lm_head(self.mlp(self.wte(idx) + self.wpe(torch.arange(idx.size(1)))))
    @torch.no_grad()
    def generate(self, idx, max_new_tokens):  # nanoGPT's loop: the whole sequence each step, no cache
        for _ in range(max_new_tokens):
            time.sleep(0.001)  # a token's own work, held so that the times stand above this machine's noise
            logits = self(idx)[:, -1, :]
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
        return idx
torch.manual_seed(0)
model = GPT().eval()
took = []
for k in range(12):
    t = time.perf_counter()
    model.generate(torch.zeros((2, 4), dtype=torch.long), 10)
    took.append((time.perf_counter() - t) * 1e3)
json.dump(took, open(sys.argv[1], "w"))
"""


def test_a_models_own_generate_is_a_generation(run_script) -> None:
    had_hook = "__init_subclass__" in vars(torch.nn.Module)
    done = run_script(SAMPLE, "--infer")
    assert done.code == 0, done.err
    record, took = done.record, done.own
    truth = statistics.median(took[1:6])  # the clean generations: after the 1 warm-up, 5 of them
    assert record["mode"] == "infer"
    assert record["metrics"]["e2e_latency"]["value"] == pytest.approx(truth, rel=0.15)
    assert record["metrics"]["e2e_latency"]["value"] <= max(took[1:6])  # inside the call, never more
    assert record["metrics"]["tpot"]["n"] == 5 * 9  # 10 forwards a generation: 1 prefill, 9 decode steps
    assert ("__init_subclass__" in vars(torch.nn.Module)) == had_hook  # torch.nn.Module as it was
