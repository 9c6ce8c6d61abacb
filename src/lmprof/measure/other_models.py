"""Other models a training step runs beside the one it trains: a teacher, a reference or reward model.

A distillation step runs a teacher's forward, a DPO step a frozen reference model's: real work of the
step that is not the trained model's FLOPs. The figures step watches, through torch's global module
hooks (installed for that one warm-up step only), which modules the step calls outermost; one with
parameters, none of them the trained model's, is another model. A module inside the model, or a wrapper
around it, shares its parameters, and a loss module has none.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook


@dataclass
class OtherModel:
    """A model the step called that is not the trained one."""

    name: str  # its class
    params: int
    calls: int  # outermost calls in the step

    def said(self) -> str:
        return f"{self.name} ({self.params:,} parameters, {self.calls} call{'s' if self.calls != 1 else ''} a step)"


class OtherModels:
    """Records, while :meth:`watching`, the outermost module calls that are other models than ``model``."""

    def __init__(self, model: torch.nn.Module):
        self._ours = {id(p) for p in model.parameters()}
        self._local = threading.local()  # depth per thread: nn.DataParallel runs replicas in threads
        self._verdict: dict[int, bool] = {}  # module id -> is another model
        self.seen: dict[int, OtherModel] = {}

    @contextlib.contextmanager
    def watching(self) -> Iterator[OtherModels]:
        pre = register_module_forward_pre_hook(self._pre)
        post = register_module_forward_hook(self._post, always_call=True)  # also when a forward raises
        try:
            yield self
        finally:
            pre.remove()
            post.remove()

    @property
    def others(self) -> list[OtherModel]:
        return list(self.seen.values())

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0 and self._other(module):
            found = self.seen.get(id(module))
            if found is None:
                self.seen[id(module)] = OtherModel(type(module).__name__, sum(p.numel() for p in module.parameters()), 1)
            else:
                found.calls += 1

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 1) - 1)

    def _other(self, module: torch.nn.Module) -> bool:
        verdict = self._verdict.get(id(module))
        if verdict is None:
            params = list(module.parameters())
            # a replica nn.DataParallel made of the model for a device is the model
            verdict = (bool(params) and not getattr(module, "_is_replica", False)
                       and not any(id(p) in self._ours for p in params))
            self._verdict[id(module)] = verdict
        return verdict
