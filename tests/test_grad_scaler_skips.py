"""fp16 training with a GradScaler: a step whose gradients hold an inf or a NaN is skipped.

``scaler.step(opt)`` then does not call ``opt.step()``, so no optimizer hook ran and `lmprof run` took that
pass of the loop and the next for one step: on a 2-layer GPT-2 (batch 4 x 32 tokens) with one skip among
the clean steps the run said 140.8 tokens a step (128 every pass), "the clean steps ran different shapes
(padding ...)"; with one in the profiled window, "1.33 backward passes per batch". fp16 is what T4 and
V100 GPUs train in, and a scaler skips steps while its scale settles and now and then after. Truth: the
script's own batch (4 x 32 tokens a pass, one backward each).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.record.catalogue import TOKENS_PER_STEP
from lmprof.record.run import Run

pytest.importorskip("transformers")

SCRIPT = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                               bos_token_id=0, eos_token_id=0))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
x = torch.randint(0, 256, (4, 32))
for i in range(12):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = m(x, labels=x).loss
    if i in (0, 3, 7):  # an overflow: the scaler skips this pass's optimizer step
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print("done", i)
"""


def test_a_skipped_optimizer_step_still_ends_a_step(tmp_path: Path, cli) -> None:
    from torch.amp.grad_scaler import GradScaler

    before = GradScaler.step
    script = tmp_path / "fp16.py"
    script.write_text(SCRIPT)
    # 1 warm-up, 4 clean, the profiler's warm-up, 2 profiled: pass 0 is the warm-up (and the
    # figures step), pass 3 a clean step, pass 7 the last profiled one
    code, out, err = cli("run", "--no-report", "--no-plots", "--warmup", "1", "--steps", "4", "--profile-steps", "2",
                         "--out", str(tmp_path / "runs"), str(script))
    assert code == 0, err
    assert out.strip().endswith("done 11")
    run = Run.load(next((tmp_path / "runs").iterdir()))
    assert run.metrics[TOKENS_PER_STEP].value == 4 * 32
    assert not [n for n in run.notes if "backward passes per batch" in n or "ran different shapes" in n], run.notes
    assert [n for n in run.notes if n.startswith("the GradScaler skipped 3 optimizer step(s)")], run.notes
    assert GradScaler.step is before  # the class is as it was
