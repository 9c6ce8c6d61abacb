"""Short and hand-written inference loops: what lmprof says when it cannot time them."""
from __future__ import annotations

from pathlib import Path

import pytest


def test_manual_forward_decode_loop_names_the_cause(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import torch

    import lmprof

    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).eval()
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, warmup=1, steps=2, profile_steps=1,
                                         report=False) as prof:
        for _ in range(5):
            ids = torch.zeros(1, 4, dtype=torch.long)
            for _ in range(3):  # the slide's loop: .forward() bypasses module hooks
                ids = torch.cat([ids, model.forward(ids)[:, -1:].argmax(-1)], dim=1)
            prof.step()
    err = capsys.readouterr().err
    assert prof.run is None
    assert "model.forward(x) bypasses the module hooks" in err and "call model(x) instead" in err
    assert "no call of Sequential was seen" in err
