"""Loops that take their gradients with ``torch.autograd.grad`` instead of ``loss.backward()``.

Found by running such a loop (``grads = torch.autograd.grad(loss, params)``, then ``p.grad = g`` and
``opt.step()``: functional-style and some RL and meta-learning trainers) under ``lmprof run``: the
whole backward pass was timed as the forward's ``loss`` row (1.49 of a 2.23 ms step, no backward
column at all), and ``memory.grads`` said "no gradients were produced". Such a call is now the step's
backward; one with ``create_graph=True`` (a gradient penalty, a meta-learning inner step) builds part
of a loss whose backward is still to come, and stays the forward's work.

Truths: torch's own trace (every autograd node it recorded in a profiled step lies inside lmprof's
backward range), the parameters' bytes by hand, and the loop itself (one ``backward()`` a batch).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import lmprof
from lmprof.record.run import Run

VOCAB, WIDTH = 64, 32


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, VOCAB))


def _profile(tmp_path: Path, step: object) -> tuple[Run, Path]:
    """The loop under ``lmprof.profile()``: its run and its folder."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (4, 16))
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=2, steps=2, profile_steps=2) as prof:
        for _ in range(10):
            step(model, x)  # type: ignore[operator]
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    return Run.load(prof.folder), Path(prof.folder)


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).reshape(-1, VOCAB), x.reshape(-1))


def _nodes_outside_backward(trace: Path) -> tuple[int, int]:
    """(autograd nodes torch recorded inside the profiled steps, of those outside every lmprof:backward range)."""
    events = [e for e in json.load(gzip.open(trace))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "lmprof:backward"]
    nodes = [e["ts"] for e in events if e["name"].startswith("autograd::engine::evaluate_function")
             and any(a <= e["ts"] <= b for a, b in steps)]
    return len(nodes), sum(not any(a <= t <= b for a, b in backward) for t in nodes)


def test_a_loop_that_takes_its_gradients_with_autograd_grad_has_a_backward(tmp_path: Path) -> None:
    def step(model: nn.Module, x: torch.Tensor) -> None:
        params = list(model.parameters())
        for p, g in zip(params, torch.autograd.grad(_loss(model, x), params)):
            p.grad = g

    run, folder = _profile(tmp_path, step)
    nodes, outside = _nodes_outside_backward(folder / "trace.json.gz")
    assert nodes > 0 and outside == 0, (nodes, outside)
    backward = {b.name for b in run.blocks if b.phase == "backward" and b.time_ms > 0}
    assert {"1", "3"} <= backward, sorted(backward)  # the two Linear layers
    n_params = sum(p.numel() for p in _model().parameters())
    assert run.metrics["memory.grads"].value == 4 * n_params  # fp32, every parameter's gradient


def test_a_gradient_penalty_built_with_create_graph_is_part_of_the_forward(tmp_path: Path) -> None:
    def step(model: nn.Module, x: torch.Tensor) -> None:
        emb = model[0](x)
        out = model[1:](emb)
        (g,) = torch.autograd.grad(out.sum(), emb, create_graph=True)  # the penalty's gradient: part of the loss
        loss = F.cross_entropy(out.reshape(-1, VOCAB), x.reshape(-1)) + 1e-3 * g.pow(2).sum()
        loss.backward()

    run, _ = _profile(tmp_path, step)
    assert not any("backward passes per batch" in n for n in run.notes), run.notes  # the loop's one backward a batch
    assert run.metrics["memory.grads"].value == 4 * sum(p.numel() for p in _model().parameters())

