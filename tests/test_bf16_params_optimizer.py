"""A loop that trains a model whose weights are bf16 with plain torch.optim.AdamW: the optimizer keeps its
moments in bf16 and no fp32 master copy. The memory estimate assumed one (16-bit parameters meant mixed
precision with master weights): 'fp32 master weights and fp32 moments', 3.6 MiB of optimizer state that
did not exist. Truth: the script's own sum of its optimizer's state tensors, and the tensors themselves."""
from __future__ import annotations


import pytest
import torch

from lmprof.pipeline.protocol.observed import master_copy

pytest.importorskip("transformers")

LOOP = """
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i in range(18):
    x = torch.randint(0, 256, (2, 32))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
json.dump({"state": state, "dtypes": sorted({str(t.dtype) for s in opt.state.values() for t in s.values()
                                             if torch.is_tensor(t) and t.dim()})}, open(sys.argv[1], "w"))
"""


def test_the_estimate_keeps_the_moments_in_the_parameters_dtype(run_script) -> None:
    done = run_script(LOOP)
    assert done.code == 0, done.err
    truth = done.own
    assert truth["dtypes"] == ["torch.bfloat16"]  # torch's AdamW: moments in the parameters' dtype
    metrics = done.record["metrics"]
    assert metrics["memory.optimizer"]["value"] == truth["state"]
    assert metrics["memory.estimated.optimizer"]["value"] == truth["state"]
    assert "no fp32 master copy" in metrics["memory.estimated.peak"]["note"]
    assert "two bf16 moments" in metrics["memory.estimated.optimizer"]["note"]


def test_a_master_copy_is_read_off_what_the_optimizer_steps() -> None:
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    own = torch.optim.AdamW(model.parameters())
    copies = torch.optim.AdamW([p.detach().float().requires_grad_() for p in model.parameters()])
    assert master_copy(model, [own]) is False
    assert master_copy(model, [copies]) is True
    assert master_copy(torch.nn.Linear(4, 4), [torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())]) is None
    assert master_copy(model, []) is None
