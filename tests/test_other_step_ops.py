"""The loop's own work between the model's phases is named by its operators when it is a tenth of the step.

A model trained with an EMA copy (torch.optim.swa_utils.AveragedModel, updated after each optimizer step) spends
about a fifth of its step in that update: before, it was `other (step)` with nothing said of what it held.
Truth: the EMA's own operator (``_foreach_lerp_`` from ``get_ema_multi_avg_fn``) runs only there; without the
update, no note names it.
"""
from __future__ import annotations


LOOP = """
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # a light step: the EMA's lerp is a fifth of it
for i in range(30):
    model(torch.randn(8, 256)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    {update}
"""


def _notes(run_script, update: str) -> list[str]:
    done = run_script(LOOP.format(update=update))
    assert done.code == 0, done.err
    return done.record["notes"]


def test_an_ema_update_is_named_in_the_steps_own_work(run_script) -> None:
    (note,) = [n for n in _notes(run_script, "ema.update_parameters(model)") if n.startswith("other (step) is")]
    assert "aten::_foreach_lerp_" in note, note


def test_without_it_no_note_names_its_operator(run_script) -> None:
    """The same loop without the update: the row (the loop's own 8% or so) names no lerp."""
    assert not any("aten::_foreach_lerp_" in n for n in _notes(run_script, "pass"))
