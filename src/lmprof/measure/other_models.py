"""Other models a training step runs beside the one it trains: a teacher, a reference or reward model.

A distillation step runs a teacher's forward, a DPO step a frozen reference model's: real work of the
step that is not the trained model's FLOPs. When the figures step begins, the live root modules (no
module's child) with parameters, none of them the trained model's, are the candidates; a forward
pre-hook on each (for that one warm-up step only) tells which the step calls. A module inside the
model, or a wrapper around it, shares its parameters, and a loss module has none. The recording probes
give each call of them a range of its own, the ``other_models`` row (names.py).

One whose every parameter the model's own optimizers step is no other model: it is trained with the model
(an encoder-decoder's or a two-tower model's other half, a value head kept apart), ``cotrained``: its
FLOPs are the training's when lmprof counts them (:func:`beyond_model`), its memory the model's.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmprof.workloads.hooks import never_compiled


@dataclass
class OtherModel:
    """A model the step called that is not the trained one."""

    name: str  # its class
    params: int
    calls: int  # outermost calls in the step
    trained: int = 0  # its parameters an optimizer steps: a module trained beside the model (a GAN's other half)
    cotrained: bool = False  # the model's own optimizers step every parameter of it: trained with the model

    def said(self, per: str = "step") -> str:
        """E.g. 'Teacher (1,024 parameters, 1 call a step)'; ``per`` a step (training: what is trained is
        said) or a generation (which trains nothing)."""
        trained = f", {self.trained:,} of them trained" if self.trained and per == "step" else ""
        return (f"{self.name} ({self.params:,} parameters{trained}, {self.calls} call{'s' if self.calls != 1 else ''} "
                f"a {per})")


class Beside:
    """The other models beside ``model`` (:func:`candidates`) and the parameters some optimizer steps, read off
    the live objects once, at the first ask (one pass over what the collector tracks: 30-100 ms), for every
    recording of a session; the models are held weakly."""

    def __init__(self, model: torch.nn.Module, optimizers: Callable[[], Sequence[torch.optim.Optimizer]] = tuple):
        self.model = model
        self._optimizers = optimizers  # the model's own, read at the first ask (a step has named them by then)
        self.cotrained: set[int] = set()  # ids of the parameters the model's own optimizers step
        self._found: list[weakref.ref[torch.nn.Module]] | None = None
        # ids of the parameters some optimizer steps: an other model's are trained beside the model. Not
        # requires_grad: a reference model left unfrozen under no_grad (as many DPO loops leave it) trains nothing
        self.stepped: set[int] = set()

    def modules(self) -> list[torch.nn.Module]:
        """The other models still alive (found at the first call, with the parameters optimizers step)."""
        if self._found is None:
            from lmprof.workloads.live import live_objects
            from lmprof.workloads.stepping import param_ids

            live = live_objects(torch.nn.Module, torch.optim.Optimizer)
            self.stepped = set().union(*(param_ids(o) for o in live if isinstance(o, torch.optim.Optimizer)))
            self.cotrained = set().union(*(param_ids(o) for o in self._optimizers()))
            self._found = [weakref.ref(m) for m in candidates(self.model, [o for o in live
                                                                           if isinstance(o, torch.nn.Module)])]
        return [m for m in (r() for r in self._found) if m is not None]


class OtherModels:
    """Records, while :meth:`watching`, the calls of other models than the one ``beside`` is of: root modules
    (no module's child) with parameters, none of them the model's."""

    def __init__(self, beside: Beside):
        self._beside = beside
        self.seen: dict[int, OtherModel] = {}

    @contextlib.contextmanager
    def watching(self) -> Iterator[OtherModels]:
        # A hook on each candidate rather than torch's global module hooks: a global hook reaches inside a
        # compiled model and makes dynamo compile it again, twice (hooks on, hooks off), and warns.
        called = never_compiled(self._called)
        handles = [m.register_forward_pre_hook(called) for m in self._beside.modules()]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    @property
    def others(self) -> list[OtherModel]:
        return list(self.seen.values())

    def _called(self, module: torch.nn.Module, args: Any) -> None:
        found = self.seen.get(id(module))
        if found is None:
            inner = getattr(module, "_orig_mod", None)  # torch.compile's wrapper: the model it compiled
            name = f"{type(inner).__name__} (compiled)" if isinstance(inner, torch.nn.Module) else type(module).__name__
            params = list(module.parameters())
            self.seen[id(module)] = OtherModel(name, sum(p.numel() for p in params), 1,
                                               sum(p.numel() for p in params if id(p) in self._beside.stepped),
                                               all(id(p) in self._beside.cotrained for p in params))
        else:
            found.calls += 1


def candidates(model: torch.nn.Module, modules: list[torch.nn.Module] | None = None) -> list[torch.nn.Module]:
    """The live root modules with parameters that share none with ``model`` (a module inside the model, or a
    wrapper around it, shares its parameters; a loss module has none), each of which takes hooks;
    ``modules``: the live modules, when the caller has read them off the collector already."""
    from lmprof.workloads.hooks import takes_hooks
    from lmprof.workloads.live import live_objects

    if modules is None:
        modules = live_objects(torch.nn.Module)
    children: set[int] = set()
    for m in modules:
        with contextlib.suppress(Exception):  # a module of someone else's whose children() fails: not ours to mend
            children.update(id(c) for c in m.children())
    ours = {id(p) for p in model.parameters()}
    out = []
    for m in modules:
        try:
            if id(m) in children or getattr(m, "_is_replica", False) or not takes_hooks(m):
                continue  # a replica nn.DataParallel made of the model for a device is the model
            params = list(m.parameters())
        except Exception:  # noqa: BLE001 - a half-built or half-torn-down module (its __getattr__ fails): skipped
            continue
        if params and not any(id(p) in ours for p in params):
            out.append(m)
    return out


def beyond_model(others: Sequence[OtherModel] | None, formulas: bool) -> bool:
    """Whether the other models a step ran put FLOPs in it beyond the model's own: any that is not trained with
    the model; and one that is, where lmprof's formulas give the model's FLOPs (they know the model alone)."""
    return any(not o.cotrained or formulas for o in others or ())
