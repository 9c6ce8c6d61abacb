"""The loop's own work between the model's phases is named by its operators when it is a tenth of the step.

A model trained with an EMA copy (torch.optim.swa_utils.AveragedModel, updated after each optimizer step) spends
about a fifth of its step in that update: before, it was `other (step)` with nothing said of what it held.
Truth: the EMA's own operator (``_foreach_lerp_`` from ``get_ema_multi_avg_fn``) runs only there; without the
update, the row is small and gets no note.
"""
from __future__ import annotations

import json
from pathlib import Path

LOOP = """
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i in range(30):
    model(torch.randn(64, 256)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    {update}
"""


def _notes(cli, tmp_path: Path, update: str) -> list[str]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP.format(update=update))
    code, _, err = cli("run", "--no-report", "--out", str(tmp_path / "runs"), str(script))
    assert code == 0, err
    (folder,) = (tmp_path / "runs").iterdir()
    return json.loads((folder / "run.json").read_text())["notes"]


def test_an_ema_update_is_named_in_the_steps_own_work(tmp_path: Path, cli) -> None:
    (note,) = [n for n in _notes(cli, tmp_path, "ema.update_parameters(model)") if n.startswith("other (step) is")]
    assert "aten::_foreach_lerp_" in note, note


def test_without_it_the_row_gets_no_note(tmp_path: Path, cli) -> None:
    assert not any(n.startswith("other (step) is") for n in _notes(cli, tmp_path, "pass"))
