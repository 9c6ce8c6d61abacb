"""The whole-run watch and a loop that evaluates and saves a checkpoint every few steps.

Before, each of those steps was a spike alert: 14 for an evaluation and a ``torch.save`` every 20 steps
over 300. The watch now reads what the clean window reads (a no-grad forward of the model, a call of
``torch.save``) and takes such a step for that work, not a spike; a slow step without either is still one.
Truth: the loop's own schedule (which steps evaluated, which one slept alone).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

import lmprof
from lmprof.record.run import Run
from lmprof.record.watch import read_series


def test_periodic_evaluations_and_checkpoints_are_no_spikes_and_a_plain_slow_step_is_one(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    save = torch.save
    evaluated = set()
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False, watch=True, watch_max_captures=0,
                        warmup=2, steps=5, profile_steps=2) as prof:
        for i in range(160):
            model(torch.randn(8, 32)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if i % 20 == 19:  # an evaluation and a checkpoint, each slow
                with torch.no_grad():
                    model(torch.randn(8, 32))
                torch.save(model.state_dict(), tmp_path / "ckpt.pt")
                time.sleep(0.05)
                evaluated.add(i + 1)  # the loop's step i is the protocol's step i + 1
            if i == 90:  # slow for no reason the watch can see
                time.sleep(0.05)
            prof.step()
    run = Run.load(prof.folder)
    w = run.watch
    assert w is not None
    spikes = [(a.first_step, a.last_step) for a in w.alerts if a.kind == "spike"]
    # The full suite under two workers failed this twice in one day, spikes at 21, 41, 61, 141 and none at 91,
    # not reproduced alone: what the series held around those steps says which rows were slow, should it recur.
    series = read_series([prof.folder / p for p in w.series])
    around = {int(s): (round(float(t) * 1e3, 2), round(float(o) * 1e3, 3))
              for s, t, o in zip(series["step"], series["step_s"], series["own_s"])
              if any(abs(int(s) - c) <= 1 for c in (20, 21, 40, 41, 91))}
    assert any(a <= 91 <= b for a, b in spikes), (spikes, "step: (step ms, own ms)", around, w.notes)
    assert not any(a <= s <= b for a, b in spikes for s in evaluated), (spikes, sorted(evaluated))
    watched = sum(1 for s in evaluated if s >= w.first_step)
    assert any(n.startswith(f"{watched} watched step(s) also ran an evaluation or saved a checkpoint") for n in w.notes), \
        w.notes
    assert torch.save is save
