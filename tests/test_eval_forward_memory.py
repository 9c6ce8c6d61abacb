"""A training step that also evaluates the model (without grad) keeps its activations figure.

Found on a loop that evaluates after every optimizer step (``model.eval(); with torch.no_grad():
model(x)``; the HF Trainer's ``eval_steps`` does it every few steps): ``memory.activations`` read
0 B, because a step runs from one optimizer step to the next, so the evaluation's forward comes
first in it and the figure was what the first forward held at its end (a no-grad forward saves
nothing). The activations are now the forward a backward follows.

Truths: the same loop without the evaluation (its training forward is the same computation), and
the bytes autograd saved for backward in one such forward, summed by the test through
``torch.autograd.graph.saved_tensors_hooks`` (storages counted once, the weights and the input left
out: they were there before the forward): a floor for what the forward holds.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import lmprof
from lmprof.record.run import Run

VOCAB, WIDTH = 64, 64


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, VOCAB))


def _activations(tmp_path: Path, evaluate: bool) -> int:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (8, 32))
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=2, steps=2, profile_steps=1) as prof:
        for _ in range(8):
            if evaluate:  # first in the step, as under `lmprof run` an evaluation after the optimizer step is
                model.eval()
                with torch.no_grad():
                    model(x)
                model.train()
            F.cross_entropy(model(x).reshape(-1, VOCAB), x.reshape(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    value = Run.load(prof.folder).metrics["memory.activations"].value
    assert isinstance(value, (int, float))
    return int(value)


def _saved_bytes() -> int:
    model = _model()
    x = torch.randint(0, VOCAB, (8, 32))
    before = {t.untyped_storage().data_ptr() for t in [x, *model.parameters()]}  # not the forward's allocations
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in before:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values())


def test_a_step_that_also_evaluates_keeps_the_training_forwards_activations(tmp_path: Path) -> None:
    alone = _activations(tmp_path / "alone", evaluate=False)
    with_eval = _activations(tmp_path / "eval", evaluate=True)
    assert with_eval == alone, (with_eval, alone)  # the old figure: 0 B
    assert with_eval >= _saved_bytes() > 0
