"""Scopes placed in someone else's step while lmprof records it (the figures step, the profiled window),
without touching their code.

Phase scopes (what attribution splits a step by):

* training: ``forward`` from the model's top-level forward until the backward starts, with ``loss``
  inside it from the model's return until then (a loss computed outside the model lands there);
  ``backward`` around every ``torch.autograd.backward`` call (``loss.backward()`` goes through it) and
  every ``torch.autograd.grad`` call without ``create_graph`` (a loop that sets ``.grad`` itself);
  ``optimizer`` around every torch.optim step; ``zero_grad`` around the optimizer's and the
  model's ``zero_grad``.
* inference: ``prefill`` from the generation's start to the end of its first top-level forward,
  then ``decode`` from the end of each forward to the end of the next (token choice included, as in
  the clean TPOT).

Block scopes inside the model come from :func:`lmprof.workloads.hooks.module_scopes`. Everything is
installed by :meth:`Probes.install` and removed by :meth:`Probes.remove`: outside the window the
user's code runs untouched.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from typing import Any, Callable

import torch

from lmprof.measure.other_models import Beside
from lmprof.modes import traits
from lmprof.names import GENERATE, LMPROF, OTHER_MODELS, SCOPE_PREFIX
from lmprof.workloads.blocks import scopes_enabled
from lmprof.workloads.hf_interface import forward_tokens
from lmprof.workloads.hooks import blocks_quiet, module_scopes, named_scopes, takes_hooks


def _scopes_itself(model: torch.nn.Module) -> bool:
    """lmprof's own GPT places its block scopes itself (switched on by ``scopes_enabled``): hooks
    would scope each block twice."""
    from lmprof.workloads.gpt import GPT

    return isinstance(model, GPT)


class ScopeStack:
    """Open ``lmprof:<name>`` ranges on the calling thread, closed last-in first-out. One stack per
    thread: the patched ``torch.autograd.backward`` and optimizer hooks run in every thread, and a range
    must be closed on the thread that opened it."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def _open(self) -> list[tuple[str, contextlib.AbstractContextManager[object]]]:
        stack: list[tuple[str, contextlib.AbstractContextManager[object]]] | None = getattr(self._local, "open", None)
        if stack is None:
            stack = self._local.open = []
        return stack

    def open(self, name: str) -> None:
        self.end_own()  # lmprof's own range never holds a scope: it ends where the scope begins
        # held as the context manager it is: record_function's own __enter__/__exit__ are unannotated
        rf: contextlib.AbstractContextManager[object] = torch.profiler.record_function(SCOPE_PREFIX + name)
        rf.__enter__()
        self._open.append((name, rf))

    def own(self) -> None:
        """lmprof's own work begins (``names.LMPROF``): open its range unless it is open already. It ends at
        the next scope opened or closed, or at :meth:`end_own`."""
        stack = self._open
        if not stack or stack[-1][0] != LMPROF:
            rf: contextlib.AbstractContextManager[object] = torch.profiler.record_function(SCOPE_PREFIX + LMPROF)
            rf.__enter__()
            stack.append((LMPROF, rf))

    def end_own(self) -> None:
        """lmprof's own work ended: close its range when it is the innermost one."""
        stack = self._open
        if stack and stack[-1][0] == LMPROF:
            stack.pop()[1].__exit__(None, None, None)

    def close(self, name: str) -> None:
        """Close ``name`` and everything opened after it; nothing when it is not open."""
        if not any(n == name for n, _ in self._open):
            return
        while self._open:
            n, rf = self._open.pop()
            rf.__exit__(None, None, None)
            if n == name:
                return

    def is_open(self, name: str) -> bool:
        return any(n == name for n, _ in self._open)

    @contextlib.contextmanager
    def around(self, name: str) -> Any:
        """``name`` open for the duration of a ``with`` block (closed even when it raises)."""
        self.open(name)
        try:
            yield
        finally:
            self.close(name)

    def close_all(self) -> None:
        while self._open:
            self._open.pop()[1].__exit__(None, None, None)


class SeenBatches:
    """The batches a step ran so far. A tensor is one already seen while it lives and has not been written
    since (a second backward on one forward, a closure re-evaluating the loss); held weakly, so a dead one's
    address, reused by the next batch, is a batch of its own."""

    def __init__(self) -> None:
        self._seen: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def new(self, batch: torch.Tensor) -> bool:
        """Whether ``batch`` is one this step has not run yet; noted as run."""
        try:
            version = batch._version
        except RuntimeError:  # an inference tensor (made under torch.inference_mode) has none: never written
            version = 0
        if any(ref() is batch and v == version for ref, v in self._seen):
            return False
        self._seen.append((weakref.ref(batch), version))
        return True

    def clear(self) -> None:
        self._seen.clear()


class Probes:
    """Everything lmprof adds to the user's step during the profiled window."""

    def __init__(self, model: torch.nn.Module | None, mode: str, *, blocks: bool = True, phases: bool = True,
                 beside: Beside | None = None):
        self.model = model
        self.beside = beside  # other models the step runs: each call of one is a range, the other_models row
        self.trains = traits(mode).trains  # training steps: forward, backward and optimizer phases are scoped
        # TorchScript modules refuse hooks: neither blocks nor the forward phase can be scoped in them
        self.hookable = model is not None and takes_hooks(model)
        self.blocks = blocks and self.hookable  # False under torch.compile: hooks would force a recompilation
        # False when lmprof's own step places the phase scopes (lmprof train / infer): hooks would nest twice.
        self.phases = phases
        self.scopes = ScopeStack()
        self._stack = contextlib.ExitStack()
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, str, Any, bool]] = []
        self.active = False
        # What the window saw over its steps (reset by the window after the profiler's warm-up step).
        self.forwards = 0
        self.backwards = 0  # top-level backward calls (a reentrant checkpoint's own backward is inside one)
        self.batches = 0  # distinct inputs the model's forward was called on (a closure's re-evaluations: one)
        self.tokens = 0  # the token ids in those batches
        self.input_shape: tuple[int, ...] | None = None
        self._inputs = SeenBatches()  # this step's batches
        self._in_backward = 0
        self._in_optimizer = False
        self._closure_batch = False  # a batch was counted inside the running optimizer step
        self._in_generate = False  # a training step's generate() runs (an RL loop's rollout)
        self._layout_hook: Any = None  # reads whether token ids are (sequence, batch): _attention_layout
        self.direct = 0  # forwards opened at a child of the model: the loop called model.forward() itself
        self._child_hooks: list[Any] = []  # their pre-hooks, until a forward through model(...) shows they are idle

    # -- install / remove --------------------------------------------------------------------
    def install(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self._stack.enter_context(scopes_enabled(True))
        if self.phases and self.beside is not None:
            # in someone else's loop: other models get their row (their hooks touch nothing of the model's,
            # compiled or not; a compiled one's are on torch.compile's wrapper, outside its compiled code)
            self._stack.enter_context(named_scopes(self.beside.modules(), OTHER_MODELS))
        if self.model is not None and self.blocks:
            if not _scopes_itself(self.model):
                self._stack.enter_context(module_scopes(self.model))
            if self.trains and self.phases and self.hookable:
                # first of the model's pre-hooks: the forward phase opens around model_glue's range
                self._handles.append(self.model.register_forward_pre_hook(self._fwd_pre, with_kwargs=True, prepend=True))
                self._handles.append(self.model.register_forward_hook(self._fwd_post, always_call=True))
                # model.forward(x) called directly runs none of the model's own hooks: its first child opens the phase
                self._child_hooks = [c.register_forward_pre_hook(self._child_pre, with_kwargs=True, prepend=True)
                                     for c in self.model.children() if takes_hooks(c)]
                self._handles += self._child_hooks
                seq_first = [m for m in self.model.modules()
                             if isinstance(m, torch.nn.MultiheadAttention) and not m.batch_first]
                if seq_first:  # read once, at the first forward: then the hook goes
                    self._layout_hook = seq_first[0].register_forward_pre_hook(self._attention_layout)
                    self._handles.append(self._layout_hook)
        if self.trains and self.phases:
            self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
            self._patch(torch.autograd, "grad", self._wrap_grad(torch.autograd.grad))
            for name in ("clip_grad_norm_", "clip_grad_value_"):  # looked up at call time by nanoGPT,
                self._patch(torch.nn.utils, name, self._wrap_clip(getattr(torch.nn.utils, name)))  # accelerate, Lightning
            generation = sys.modules.get("transformers.generation.utils")  # loaded by the user's code, or not used
            if generation is not None:
                mixin = generation.GenerationMixin
                self._patch(mixin, "generate", self._wrap_generate(mixin.generate))
            owners: list[Any] = [*optimizers, *([self.model] if self.model is not None else [])]
            for obj in owners:
                self._patch(obj, "zero_grad", self._wrap_zero_grad(obj.zero_grad), instance=True)
        self.active = True

    def remove(self) -> None:
        self.scopes.close_all()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for obj, attr, old, instance in reversed(self._patched):
            if instance:
                obj.__dict__.pop(attr, None)  # back to the class's method
            else:
                setattr(obj, attr, old)
        self._patched.clear()
        self._stack.close()
        self.active = False

    def _patch(self, obj: Any, attr: str, new: Any, instance: bool = False) -> None:
        self._patched.append((obj, attr, getattr(obj, attr), instance))
        setattr(obj, attr, new)

    # -- training phases ---------------------------------------------------------------------
    def _end_forward(self) -> None:
        self.scopes.close("forward")

    def _fwd_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._in_generate:
            return  # a rollout's forwards are the generate row's, not the training forward
        if module is self.model and self._child_hooks:
            for h in self._child_hooks:  # the loop calls model(...): the children's hooks would only cost time
                h.remove()
            self._child_hooks = []
        self._end_forward()  # a forward with no backward after it (evaluation) ends here
        self.scopes.own()  # counting the batch is lmprof's, not the model's forward: before the forward's scope
        try:
            self.forwards += 1
            if torch.is_grad_enabled() or not self.trains:  # not an evaluation inside a training step (no grad)
                ids, tokens = forward_tokens(args, kwargs)
                self._count_batch(ids, tokens)
                if self.input_shape is None and tokens is not None:
                    self.input_shape = tokens
        finally:
            self.scopes.open("forward")  # ends lmprof's own range

    def _child_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A child of the model runs outside the model's forward: the loop called ``model.forward(x)``, which runs
        none of the model's hooks, so the forward phase opens here (its batch read off the child's input)."""
        if self.scopes.is_open("forward") or self._in_backward or self._in_optimizer or self._in_generate:
            return
        self.direct += 1
        self._fwd_pre(module, args, kwargs)

    def _attention_layout(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """torch's nn.MultiheadAttention with ``batch_first=False`` (nn.Transformer's default) takes its query
        as (sequence, batch, width): token ids of that (sequence, batch) shape were read as (batch, sequence)
        (PyTorch's language-modeling tutorial feeds them so). Ids the model transposes itself stay as read."""
        shape = self.input_shape
        if shape is None:
            return  # no batch read yet (a forward without grad in a training step): the next forward tells
        if self._layout_hook is not None:
            self._layout_hook.remove()  # one forward tells; the others would only cost time in the attention's row
            self._layout_hook = None
        query = args[0] if args else None
        if (isinstance(query, torch.Tensor) and query.dim() == 3 and len(shape) == 2
                and shape[0] != shape[1] and tuple(shape) == (query.shape[0], query.shape[1])):
            self.input_shape = (shape[1], shape[0])

    def _count_batch(self, ids: Any, tokens: tuple[int, int] | None = None) -> None:
        """A forward on ``ids``: a new batch unless it is one this step already ran (the same tensor, not
        written since: a second backward on one forward, a closure re-evaluating the loss), or it runs
        inside an optimizer step that counted one (LBFGS's closure, which may copy its input each time).
        Tensors are held weakly: a dead one was a batch of its own, whatever its address."""
        if self._in_optimizer and self._closure_batch:
            return
        if isinstance(ids, torch.Tensor):
            if not self._inputs.new(ids):
                return
            if tokens is not None:  # token ids, or the embeddings of (batch, sequence) tokens
                self.tokens += tokens[0] * tokens[1]
        self.batches += 1
        self._closure_batch = self._in_optimizer

    def _fwd_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._in_generate and self.scopes.is_open("forward"):
            self.scopes.open("loss")

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._in_backward:  # inside a backward (a reentrant checkpoint recomputing): part of that one
                return original(*args, **kwargs)
            return self._backward(original, *args, **kwargs)

        return backward

    def _backward(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A top-level backward pass of the step (``torch.autograd.backward`` or ``grad``), scoped."""
        self._end_forward()
        self.backwards += 1
        self._in_backward += 1
        try:
            with self.scopes.around("backward"):
                return original(*args, **kwargs)
        finally:
            self._in_backward -= 1

    def _wrap_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def grad(*args: Any, **kwargs: Any) -> Any:
            # A loop that takes its gradients as torch.autograd.grad(loss, params) and sets .grad itself
            # runs its backward here. With create_graph the gradients are part of a loss still being built
            # (a gradient penalty, a meta-learning inner step): the forward's work, its backward is to come.
            if self._in_backward or kwargs.get("create_graph") or (len(args) > 4 and args[4]):
                return original(*args, **kwargs)
            return self._backward(original, *args, **kwargs)

        return grad

    def _wrap_generate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            # generate() inside a training step (an RL loop's rollout: GRPO, PPO): one row, 'generate', with
            # no forward scope nor block ranges inside, so the training forward's rows stay the training's
            if self._in_generate:
                return original(model, *args, **kwargs)
            self._end_forward()
            self._in_generate = True
            try:
                with self.scopes.around(GENERATE), blocks_quiet():
                    return original(model, *args, **kwargs)
            finally:
                self._in_generate = False

        return generate

    def _wrap_clip(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def clip(*args: Any, **kwargs: Any) -> Any:
            if self.scopes.is_open("grad_clip"):  # clip_grad_norm_ calling a clip of its own
                return original(*args, **kwargs)
            self._end_forward()
            with self.scopes.around("grad_clip"):
                return original(*args, **kwargs)

        return clip

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            if self.scopes.is_open("zero_grad"):  # the model's zero_grad called from the optimizer's
                return original(*args, **kwargs)
            self._end_forward()
            with self.scopes.around("zero_grad"):
                return original(*args, **kwargs)

        return zero_grad

    def optimizer_begin(self) -> None:
        self._in_optimizer, self._closure_batch = True, False
        if self.active and self.trains and self.phases:
            self._end_forward()
            self.scopes.open("optimizer")

    def optimizer_end(self) -> None:
        self._in_optimizer = False
        if self.active:
            self.scopes.close("optimizer")
            self.scopes.own()  # what follows in the hook, up to the step's end, is lmprof's (the trigger ends it)

    # -- inference phases --------------------------------------------------------------------
    def generation_begin(self) -> None:
        if self.phases:
            self.scopes.open("prefill")

    def forward_end(self) -> None:
        """A top-level forward of the model ended inside a generation: the next phase is decode."""
        self.forwards += 1
        if not self.phases:
            return
        for phase in ("prefill", "decode"):
            self.scopes.close(phase)
        self.scopes.open("decode")
        self.scopes.own()  # the rest of the hook is lmprof's (Windows.own_work ends it)

    def step_end(self) -> None:
        """The step's boundary: nothing stays open across it, and the next step's batches are its own."""
        self.scopes.close_all()
        self._inputs.clear()

    def reset_counts(self) -> None:
        """Count from here (the profiler's own warm-up step is not a profiled step)."""
        self.forwards = self.backwards = self.batches = self.tokens = 0
