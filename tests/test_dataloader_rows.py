"""A user's loop that reads its batches from a DataLoader gets a ``data`` row, and advice when it waits.

Found by profiling a loop whose Dataset reads slowly: 60% of the step was the DataLoader's
``__next__``, shown as ``other (step)``, and no advice said so, where lmprof's own loop has a
``data`` row. torch records ``enumerate(DataLoader)#...__next__`` around each batch it fetches: that
range is now the step's ``data`` row, and a ``data`` share of at least 25% of a training step (the
whole-run watch's input-bound share) brings the ``data_share`` advice.

Truths: torch's own ranges in the trace (the row's profiled time is their duration, step by step)
and the Dataset's own sleeps (a floor for that time).
"""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import lmprof
from lmprof.analysis.advice import advise
from lmprof.record.run import Run

VOCAB, BATCH, SLEEP_S = 64, 4, 0.002


class SlowReads(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(SLEEP_S)  # a slow reader: BATCH x SLEEP_S a batch
        return torch.randint(0, VOCAB, (16,))


def _profile(tmp_path: Path, loader: bool) -> Run:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(SlowReads(), batch_size=BATCH)) if loader else None
    fixed = torch.randint(0, VOCAB, (BATCH, 16))
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=1, steps=2, profile_steps=2) as prof:
        for _ in range(8):
            x = next(batches) if batches is not None else fixed
            F.cross_entropy(model(x).reshape(-1, VOCAB), x.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return Run.load(prof.folder)


def _loader_ms_per_step(folder: Path) -> float:
    """The mean over the profiled steps of torch's DataLoader ranges in them, ms."""
    events = [e for e in json.load(gzip.open(folder / "trace.json.gz"))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    inside = [e["dur"] for e in events if e["name"].startswith("enumerate(DataLoader)#")
              and any(a <= e["ts"] < b for a, b in steps)]
    return sum(inside) / len(steps) / 1e3


def test_the_dataloaders_batches_are_the_data_row_and_bring_advice(tmp_path: Path) -> None:
    run = _profile(tmp_path / "loader", loader=True)
    (data,) = [b for b in run.blocks if b.name == "data" and b.phase == "step"]
    (folder,) = [p for p in (tmp_path / "loader").iterdir() if (p / "run.json").is_file()]
    assert abs(data.profiled_ms - _loader_ms_per_step(folder)) < 1e-6  # torch's ranges, as recorded
    assert data.profiled_ms >= BATCH * SLEEP_S * 1e3  # the Dataset's own sleeps
    assert "data_share" in [r.rule for r in advise(run)]


def test_a_loop_without_a_dataloader_has_no_data_row_nor_advice(tmp_path: Path) -> None:
    run = _profile(tmp_path, loader=False)
    assert "data" not in {b.name for b in run.blocks}
    assert "data_share" not in [r.rule for r in advise(run)]
