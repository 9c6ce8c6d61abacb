"""A loop that calls ``model.forward(x)`` itself runs none of the model's own hooks.

Before, the forward phase never opened: the model's blocks ran in the step's phase ("0", "1", "2" as step
rows, no forward column) and their backward nodes were said to have no forward op. Now the model's first child
opens the phase. Truth: the script's own stopwatch around each ``model.forward(x)`` (its own forward hooks
cannot see it: it times the call), as a share of the loop's pass (the rows are scaled to the clean step by
one factor; a share does not move with it, so this holds on a loaded machine too).
"""
from __future__ import annotations

import statistics

import pytest

LOOP = """
import json, sys, time
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
spent, passes = [], []
for i in range(24):
    start = time.perf_counter()
    x = torch.randn(64, 256)
    began = time.perf_counter()
    out = model.forward(x)
    spent.append(time.perf_counter() - began)
    out.pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    passes.append(time.perf_counter() - start)
json.dump([s / p for s, p in zip(spent, passes)], open(sys.argv[1], "w"))
"""


@pytest.mark.stopwatch  # the share against the script's stopwatch wants the machine to itself
def test_a_direct_forward_call_is_the_forward_phase(run_script) -> None:
    done = run_script(LOOP)
    assert done.code == 0, done.err
    record = done.record
    rows = done.rows()
    assert {("0", "forward"), ("1", "forward"), ("2", "forward")} <= set(rows), rows
    assert not any(name in ("0", "1", "2") and phase == "step" for name, phase in rows), rows
    share = sum(rows[(n, "forward")] for n in ("0", "1", "2")) / sum(rows.values())
    truth = statistics.median(done.own[3:13])  # the clean steps' passes (the first pass ends warm-up step 1)
    assert share == pytest.approx(truth, rel=0.3), (rows, truth)
    assert any(n.startswith("the loop calls model.forward(...) itself") for n in record["notes"])
