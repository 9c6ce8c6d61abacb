"""The FLOP count of a training step that also evaluated the model is the training step's.

Found on a loop that evaluates every other step (``model.eval(); with torch.no_grad(): ...``, as the
HF Trainer's ``eval_steps=2`` does): for a model lmprof has no formulas for, FLOPs are counted with
FlopCounterMode on one warm-up step, and when that step was one that evaluated, the count held the
evaluation's forwards too: twice the training step's FLOPs, MFU 71.6% where it was 38%, while the
step time left the evaluating steps out. The model's forwards without grad are now counted apart,
left out of the count, and a note says how many FLOPs that was.

Truth: FlopCounterMode over one training step of the same model and batch (forward and backward),
taken by the test.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import lmprof
from lmprof.record.run import Run

VOCAB, WIDTH = 64, 64


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, VOCAB))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).reshape(-1, VOCAB), x.reshape(-1))


def test_an_evaluation_in_the_counted_step_is_left_out_of_its_flops(tmp_path: Path) -> None:
    x = torch.randint(0, VOCAB, (8, 32))
    with FlopCounterMode(display=False) as truth:
        _loss(_model(), x).backward()
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=3, steps=2, profile_steps=1) as prof:
        for _ in range(10):
            _loss(model, x).backward()
            opt.step()
            model.eval()
            with torch.no_grad():  # every step evaluates: the counted one too
                for _ in range(2):
                    model(x)
            model.train()
            opt.zero_grad(set_to_none=True)
            prof.step()
    run = Run.load(prof.folder)
    assert run.metrics["flops.model_per_step"].value == truth.get_total_flops()  # the old count: 1 + 2/3 of it
    assert any("also ran the model without grad (an evaluation)" in n and "FLOPs are left out" in n
               for n in run.notes), run.notes
