"""Which optimizers step which parameters: the optimizer hooks (triggers.py) judge with it whether a
step is the model's, and the figures step finds the optimizers no hook saw (windows/figures.py)."""
from __future__ import annotations

import torch

from lmprof.workloads.live import live_objects


def param_ids(opt: torch.optim.Optimizer) -> set[int]:
    """The ids of the parameters ``opt`` steps."""
    return {id(p) for g in opt.param_groups for p in g["params"]}


def optimizers_stepping(model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """The live optimizers that step a parameter of ``model`` (read off the collector: 0.05-0.15 s)."""
    mine = {id(p) for p in model.parameters()}
    return [o for o in live_objects(torch.optim.Optimizer) if not mine.isdisjoint(param_ids(o))]
