"""Sparse gradients (``nn.Embedding(sparse=True)``, stepped by ``SparseAdam``) hold bytes too.

Found by training such an embedding beside an AdamW body: ``memory.grads`` counted the dense
gradients only (194 KiB of 326), since a sparse tensor has no storage of its own and its bytes
were read as 0. A sparse tensor's bytes are now its indices' and its values'.

Truth: the gradients' bytes summed by the test from the tensors themselves (``_indices()`` and
``_values()`` of the sparse one, ``nbytes`` of the dense ones) after one backward of the same loop.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import lmprof
from lmprof.measure.tensor_bytes import tensor_bytes
from lmprof.record.run import Run

VOCAB, WIDTH = 64, 32


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH, sparse=True), nn.Linear(WIDTH, VOCAB))


def _grad_bytes(model: nn.Module) -> int:
    total = 0
    for p in model.parameters():
        g = p.grad
        assert g is not None
        total += g._indices().nbytes + g._values().nbytes if g.is_sparse else g.nbytes
    return total


def test_sparse_gradients_count_their_indices_and_values(tmp_path: Path) -> None:
    x = torch.randint(0, VOCAB, (4, 16))
    probe = _model()
    F.cross_entropy(probe(x).reshape(-1, VOCAB), x.reshape(-1)).backward()
    truth = _grad_bytes(probe)
    assert tensor_bytes(p.grad for p in probe.parameters() if p.grad is not None) == truth

    model = _model()
    sparse = torch.optim.SparseAdam(list(model[0].parameters()), lr=1e-3)
    dense = torch.optim.AdamW(model[1].parameters(), lr=1e-3)
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=2, steps=2, profile_steps=1) as prof:
        for _ in range(7):
            F.cross_entropy(model(x).reshape(-1, VOCAB), x.reshape(-1)).backward()
            sparse.step()
            dense.step()
            sparse.zero_grad()
            dense.zero_grad()
            prof.step()
    assert Run.load(prof.folder).metrics["memory.grads"].value == truth  # the old figure: the dense ones only
