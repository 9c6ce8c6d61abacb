"""A generation's time outside the model's forward is named: ``generate_loop``.

In a profiled generation whose model lmprof hooks (its forward claimed whole by ``model_glue``), the
prefill's and decode's own time is the generation loop's: token choice (logits processors, sampling),
stopping criteria, cache bookkeeping. It was ``other``: ~30% of a sampled HF ``generate()`` on a CPU,
read as unclaimed. A compiled model (no ``model_glue``) keeps ``other``: there the forward is in it too.

Truth: the loop's own token choice, made slow by a known sleep after each forward (the test's), and
the model's rows, which must not hold it.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

import lmprof
from lmprof.record.run import Run

SLEEP_S = 0.01
FORWARDS = 4  # a prefill and three decode steps


def test_the_loops_own_work_between_forwards_is_the_generate_loop_row(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, report=False, verbose=False,
                                         warmup=1, steps=2, profile_steps=1) as prof:
        for _ in range(4):
            ids = torch.randint(0, 64, (2, 8))
            for _ in range(FORWARDS):
                logits = model(ids)
                time.sleep(SLEEP_S)  # a slow token choice, the loop's own
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
            prof.step()
    run = Run.load(prof.folder)
    rows = {(b.name, b.phase): b.profiled_ms for b in run.blocks}
    # decode runs from the first forward's end to the last one's: FORWARDS - 1 token choices inside it
    assert rows[("generate_loop", "decode")] >= (FORWARDS - 1) * SLEEP_S * 1e3, rows
    assert ("other", "decode") not in rows, rows
    model_rows = sum(v for (n, p), v in rows.items() if p == "decode" and n != "generate_loop")
    assert model_rows < SLEEP_S * 1e3, rows  # none of the sleeps in the model's rows
