"""Where each top-level forward of a generation ends, whether the loop calls ``model(x)`` or ``model.forward(x)``.

``model(x)`` runs the model's own forward hook, which marks the end. ``model.forward(x)`` (the
lecture's decode loop) runs no hook of the model, but its submodules' hooks still run: the forward is
then the stretch from one call of the submodule it begins with to the next, and ends where its last
outermost submodule call ends. Which submodules those are is learned in the first generation that
calls ``.forward()``: hooks on every submodule, their calls' nesting tracked, each forward marked as
the next one begins (or the generation ends). From the next generation on, two hooks remain: on the
submodule each forward begins with (its input is the prompt) and on the one it ends with (its end is
the forward's end, marked as the model's own hook would).

Deciding costs one global forward pre-hook for the first module call of the first generation: the
model's own call (``model(x)``) or one of its submodules' (``.forward()``) comes first. A submodule
called outside the model's own call is not proof of ``.forward()``: ``generate()`` of an
encoder-decoder calls its encoder first. So the model's own call, whenever it comes, decides for
``model(x)``: the learning hooks go, and the model's own hook marks the forwards.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from lmprof.workloads.hooks import never_compiled, takes_hooks

OnForward = Callable[[Any, Any], None]


class Outputs(tuple):  # type: ignore[type-arg]  # a tuple of whatever the submodules returned
    """The outputs of one ``.forward()`` call's outermost submodule calls (the KV cache is in one of them)."""


def _ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs.get("input_ids", args[0] if args else None)


class ForwardEnds:
    """Calls ``on_forward(output, ids)`` as each top-level forward of ``model`` ends (``ids``: its input)."""

    def __init__(self, model: torch.nn.Module, on_forward: OnForward, compiled: bool = False):
        self.model, self.on_forward = model, on_forward
        # then "own" (model(x)), "learning" or "bypass" (model.forward(x)); a compiled model is called, and no
        # hook goes inside it (nor a global one, whose removal would make dynamo compile its call again)
        self.mode = "own" if compiled else "deciding"
        self._handles: list[Any] = []  # the model's own hooks, kept to the end
        self._learning: list[Any] = []  # submodules' hooks: every one while learning, then first and last
        self._decider: Any = None
        self._members = {id(m): m for m in model.modules() if m is not model and takes_hooks(m)}
        self._depth = 0
        self._first: torch.nn.Module | None = None  # the submodule each forward begins with
        self._last: torch.nn.Module | None = None  # the outermost submodule call that ended last
        self._ids: Any = None
        self._outputs: list[Any] = []
        self._open = False  # learning: a forward began and is not marked yet

    @classmethod
    def installed(cls, model: torch.nn.Module, on_forward: OnForward,
                  on_done: Callable[[Callable[[], None]], None], compiled: bool = False) -> "ForwardEnds":
        """Hooked on ``model`` (nothing when it takes no hooks), ``on_done`` given what removes them."""
        ends = cls(model, on_forward, compiled)
        if ends.install():
            on_done(ends.remove)
        return ends

    def install(self) -> bool:
        """Hook the model; False when it takes no hooks (TorchScript)."""
        if not takes_hooks(self.model):
            return False
        self._handles.append(self.model.register_forward_pre_hook(never_compiled(self._own_begins)))
        self._handles.append(self.model.register_forward_hook(never_compiled(self._own_end), with_kwargs=True,
                                                              always_call=True))
        if self.mode == "deciding":
            self._decider = torch.nn.modules.module.register_module_forward_pre_hook(self._decide)
        return True

    def remove(self) -> None:
        for h in [*self._handles, *self._learning, *([self._decider] if self._decider is not None else [])]:
            h.remove()
        self._handles, self._learning, self._decider = [], [], None

    # -- model(x) --------------------------------------------------------------------------------
    def _own_begins(self, module: torch.nn.Module, args: Any) -> None:
        if self.mode != "own":  # the model's own call decides, whatever came first
            self.mode = "own"
            self._drop_submodule_hooks()

    def _drop_submodule_hooks(self) -> None:
        for h in [*self._learning, *([self._decider] if self._decider is not None else [])]:
            h.remove()
        self._learning, self._decider, self._depth, self._open = [], None, 0, False

    def _own_end(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if self.mode == "own":
            self.on_forward(output, _ids(args, kwargs))

    def _decide(self, module: torch.nn.Module, args: Any) -> None:
        """The first module call after install: the model's own, or one of its submodules' (``.forward()``)."""
        if module is self.model:
            pass  # its own pre-hook decides
        elif id(module) in self._members:
            self.mode = "learning"
            for m in self._members.values():
                self._learning.append(m.register_forward_pre_hook(self._learn_pre, with_kwargs=True))
                self._learning.append(m.register_forward_hook(self._learn_post, always_call=True))
            self._learn_pre(module, args, {})  # this call's own pre-hook was registered too late to run for it
        else:
            return  # another module (the user's own preprocessing): not decided yet
        if self._decider is not None:
            self._decider.remove()
            self._decider = None

    # -- model.forward(x), first generation: learn where a forward begins and ends ---------------
    def _learn_pre(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if self._depth == 0:
            if self._first is None:
                self._first = module
            if module is self._first:  # a new forward begins: the one before has ended
                self._mark_open()
                self._open, self._ids, self._outputs = True, _ids(args, kwargs), []
        self._depth += 1

    def _learn_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._last = module
            self._outputs.append(output)

    def _mark_open(self) -> None:
        if self._open:
            self._open = False
            self.on_forward(Outputs(self._outputs), self._ids)

    def generation_ends(self) -> None:
        """The generation ended: a learning generation's last forward is marked, and from now on only
        the first and last submodules of a forward are hooked."""
        if self.mode != "learning":
            return
        self._mark_open()
        self._drop_submodule_hooks()
        first, last = self._first, self._last
        if first is None or last is None:
            return
        self.mode = "bypass"
        self._learning.append(first.register_forward_pre_hook(self._begins, with_kwargs=True))
        if first is not last:  # its output may hold the KV cache (a base model's, under an LM head)
            self._learning.append(first.register_forward_hook(self._began, always_call=True))
        self._learning.append(last.register_forward_hook(self._ends, always_call=True))

    # -- model.forward(x), later generations -----------------------------------------------------
    def _begins(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        self._ids, self._outputs = _ids(args, kwargs), []

    def _began(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._outputs.append(output)

    def _ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.on_forward(Outputs([*self._outputs, output]), self._ids)
