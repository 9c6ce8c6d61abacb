"""Which optimizers step which parameters: the optimizer hooks (pipeline/protocol/triggers.py) judge with it
whether a step is the model's, the figures step finds the optimizers no hook saw (windows/figures.py), the
other models beside the model are told trained or not (measure/other_models.py), whether a user's
optimizers keep a master copy of the model's weights is read (pipeline/protocol/observed.py), and the memory
figures count the parameters the model's optimizers step outside it (measure/tensor_bytes.py)."""
from __future__ import annotations

import torch

from lmprof.workloads.live import live_objects


def params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``opt`` steps."""
    return [p for g in opt.param_groups for p in g["params"]]


def param_ids(opt: torch.optim.Optimizer) -> set[int]:
    """The ids of the parameters ``opt`` steps."""
    return {id(p) for p in params(opt)}


def optimizers_stepping(model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """The live optimizers that step a parameter of ``model`` (read off the collector: 0.05-0.15 s)."""
    mine = {id(p) for p in model.parameters()}
    return [o for o in live_objects(torch.optim.Optimizer) if not mine.isdisjoint(param_ids(o))]
