"""Where step boundaries come from when the user's code is not changed.

* Training: torch.optim's global optimizer-step hooks. At the first optimizer step, the model is
  found as the module holding the most of the optimizer's parameters (the outermost one on a tie,
  unwrapped from DDP and torch.compile); with several optimizers, steps are those of the largest.
* Inference: ``transformers``' ``GenerationMixin.generate``, patched on the class while the session
  runs: each call is a generation, the receiver is the model.
"""
from __future__ import annotations

import functools
import gc
import warnings
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from lmprof.pipeline.usercode.session import Session


def _live_objects() -> list[Any]:
    # isinstance() on some lazily deprecated module attributes warns (torch.distributed.reduce_op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, (torch.nn.Module, torch.optim.Optimizer))]


def _n_params(opt: torch.optim.Optimizer) -> int:
    return sum(p.numel() for g in opt.param_groups for p in g["params"])


def _unwrap(module: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module that really runs, and whether it is compiled (torch.compile or Module.compile)."""
    compiled = False
    while True:
        inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, torch.nn.Module):
            module, compiled = inner, True
            continue
        inner = getattr(module, "module", None)  # DistributedDataParallel, DataParallel
        if isinstance(inner, torch.nn.Module) and isinstance(
                module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            module = inner
            continue
        break
    return module, compiled or getattr(module, "_compiled_call_impl", None) is not None


def find_model(opt: torch.optim.Optimizer) -> tuple[torch.nn.Module | None, bool]:
    """The module whose parameters ``opt`` holds (see module doc), and whether it is compiled."""
    wanted = {id(p) for g in opt.param_groups for p in g["params"]}
    best: tuple[tuple[int, int], torch.nn.Module] | None = None
    for obj in _live_objects():
        if not isinstance(obj, torch.nn.Module):
            continue
        covered = sum(1 for p in obj.parameters() if id(p) in wanted)
        if not covered:
            continue
        key = (covered, sum(1 for _ in obj.modules()))  # ties: the outermost (most submodules)
        if best is None or key > best[0]:
            best = (key, obj)
    if best is None:
        return None, False
    return _unwrap(best[1])


class OptimizerTrigger:
    """Step boundaries from every torch.optim optimizer step (global hooks).

    With ``boundaries=False`` (``lmprof.profile``, the Trainer callback: steps come from elsewhere)
    the hooks only place the ``optimizer`` scope in the profiled window.
    """

    def __init__(self, session: Session, boundaries: bool = True):
        self.session = session
        self.boundaries = boundaries
        self.chosen: torch.optim.Optimizer | None = None
        self._handles: list[Any] = []

    def install(self) -> None:
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        self.session.on_done(self.remove)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if opt is self.chosen or not self.boundaries:
            self.session.optimizer_begin()

    def _post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.boundaries:
            self.session.optimizer_end()
            if not any(o is opt for o in self.session.optimizers):
                self.session.optimizers.append(opt)  # its zero_grad gets a scope in the window
            return
        if self.chosen is None:
            self._choose(opt)
        if opt is self.chosen:
            self.session.optimizer_end()
            self.session.boundary()

    def _choose(self, stepped: torch.optim.Optimizer) -> None:
        # Only optimizers whose step runs these hooks count: a wrapper (accelerate's AcceleratedOptimizer)
        # shares the inner optimizer's groups but steps through it.
        gc.collect()  # optimizers of code that already finished must not be counted
        opts = [o for o in _live_objects() if isinstance(o, torch.optim.Optimizer)
                and getattr(type(o).step, "hooked", False)] or [stepped]
        if stepped not in opts:
            opts.append(stepped)
        opts.sort(key=_n_params, reverse=True)
        self.chosen = opts[0]
        model, compiled = find_model(self.chosen)
        s = self.session
        if model is None:
            s.notes.append("no nn.Module holds the optimizer's parameters: no block scopes, forward shows as 'other'")
            s.device = _device_of_params(self.chosen)
        else:
            s.attach(model, [self.chosen], compiled=compiled)
            s.notes.append(f"model: {type(model).__name__}, the module holding the optimizer's parameters")
        if len(opts) > 1:
            others = ", ".join(f"{type(o).__name__} ({_n_params(o):,} params)" for o in opts[1:4])
            s.notes.append(f"{len(opts)} optimizers: steps are counted on the largest, {type(self.chosen).__name__} "
                           f"({_n_params(self.chosen):,} params); also present: {others}")
        if compiled:
            s.notes.append("torch.compile: the model is compiled, so lmprof placed no hooks in it (they would force "
                           "a recompilation): its forward is not split into blocks and shows as step 'other'")


def _device_of_params(opt: torch.optim.Optimizer) -> Any:
    from lmprof.hardware.devices import resolve_device

    p = next((p for g in opt.param_groups for p in g["params"]), None)
    return resolve_device(str(p.device) if p is not None else "cpu")


class GenerateTrigger:
    """Generations from ``transformers``' ``generate`` (class patched while the session runs)."""

    def __init__(self, session: Session):
        self.session = session
        self._original: Any = None
        self._cls: Any = None

    def install(self) -> bool:
        """Patch ``GenerationMixin.generate``; False when transformers is not installed."""
        try:
            from transformers.generation.utils import GenerationMixin
        except ImportError:
            return False
        self._cls, self._original = GenerationMixin, GenerationMixin.generate
        original, session = self._original, self.session
        depth = [0]

        @functools.wraps(original)
        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0] or session.done:  # generate calling generate (assisted decoding): one generation
                return original(model, *args, **kwargs)
            depth[0] += 1
            session.generation_begin(model, args, kwargs)
            try:
                return original(model, *args, **kwargs)
            finally:
                depth[0] -= 1
                session.generation_end()

        GenerationMixin.generate = generate  # wraps transformers' method; remove() restores it
        self.session.on_done(self.remove)
        return True

    def remove(self) -> None:
        if self._cls is not None:
            self._cls.generate = self._original
            self._cls = None
