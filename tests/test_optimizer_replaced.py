"""A loop that re-creates its optimizer (a short warm-up phase with SGD, then AdamW on the same parameters): the
steps are counted across the change (triggers.py), but the memory came from the figures step, which ran the SGD:
memory.optimizer read 0 B of AdamW state and memory.peak less than AdamW's own bytes. Truth: the script's own
count of its AdamW's state tensors."""
from __future__ import annotations

import pytest

LOOP = """
import json, sys, torch
m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(int(sys.argv[2])):  # the warm-up phase
    m(torch.randn(16, 64)).sum().backward(); opt.step(); opt.zero_grad()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)  # the training proper
for i in range(30):
    m(torch.randn(16, 64)).sum().backward(); opt.step(); opt.zero_grad()
state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
json.dump({"state_bytes": sum(t.numel() * t.element_size() for t in state)}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("sgd_passes", [5, 1])  # replaced long after the figures step (2), or in it
def test_the_optimizer_memory_is_the_one_that_stepped_the_measured_steps(run_script, sgd_passes):
    r = run_script(LOOP, args=(str(sgd_passes),))
    assert r.code == 0 and r.record is not None, r.err
    m = r.record["metrics"]
    assert r.record["config"]["optimizer"] == "adamw"
    assert m["memory.optimizer"]["value"] == r.own["state_bytes"]  # 2 moments of 33,088 fp32 values + 4 step counters
    # the figures step ran the SGD, or the AdamW's first step before its state existed: no peak of the AdamW steps
    assert m["memory.peak"]["value"] is None
    assert "the loop replaced its SGD with AdamW" in m["memory.peak"]["note"], m["memory.peak"]
    assert m["memory.params"]["value"] == 33_088 * 4  # the rest is the model's, whichever optimizer
