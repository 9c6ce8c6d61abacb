"""lmprof.profile() counts steps at prof.step(): a loop that never calls it is told so, not that it stepped no optimizer."""
from __future__ import annotations

import pytest
import torch

import lmprof


@pytest.mark.parametrize("infer", [False, True])
def test_a_with_block_without_prof_step_is_told_to_call_it(tmp_path, capsys, infer):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stepped = 0
    with lmprof.profile(model, out=tmp_path, infer=infer) as prof:
        for _ in range(6):
            if infer:
                with torch.no_grad():
                    model(torch.randn(2, 8))
            else:
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
                stepped += 1
    err = capsys.readouterr().err
    assert prof.run is None and not any(tmp_path.iterdir())
    unit = "generation" if infer else "step"
    assert (f"lmprof: the with-block ended before any prof.step() call: nothing measured (lmprof.profile() counts "
            f"a {unit} at each prof.step(): call it once per {unit}") in err, err
    # The loop did step its optimizer (6 times in training): the run's line must not say otherwise.
    assert stepped == (0 if infer else 6)
    assert "without stepping a torch.optim optimizer" not in err and "without calling generate()" not in err


def test_a_loop_that_raises_before_its_first_prof_step_says_so(tmp_path, capsys):
    model = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError):
        with lmprof.profile(model, out=tmp_path):
            model(torch.randn(2, 8))
            raise ValueError("the user's own")
    assert "lmprof: the loop raised ValueError before any prof.step() call: nothing measured" in capsys.readouterr().err
