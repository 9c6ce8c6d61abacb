"""The smallest training loop a test can profile: a few SGD steps of a model that maps 4 features to 4."""
from __future__ import annotations

from typing import Any

import torch


def sgd_steps(model: torch.nn.Module, prof: Any, steps: int = 5) -> None:
    """``steps`` SGD steps of ``model`` on random (2, 4) batches, each ended with ``prof.step()``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
