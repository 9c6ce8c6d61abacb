"""Tensors a training loop keeps alive into backward beyond what autograd saved: the evidence behind a
measured-minus-estimated memory difference.

The analytic estimate counts what autograd saves for backward, and the logits only while the loss is
computed. A loop written ``outputs = model(x, labels=y); outputs.loss.backward()`` keeps ``outputs``,
and with it the (batch, seq, vocab) logits, alive through backward: the measured activations are
larger by exactly those bytes. :class:`HeldOutputs` finds them on the figures step, from the tensors
themselves: it keeps weak references to the tensors the model's forward returned and, when backward
reaches the first of their autograd nodes, walks the graph behind them for the tensors autograd saved
(each node's ``_saved_*`` fields, a custom Function's ``saved_tensors``) and lists the returned
tensors still alive whose storage is not among those. Weak references and a node pre-hook only: the
loop frees what it frees, and no global autograd hook is installed (saved-tensor default hooks would
make ``torch.autograd.graph.disable_saved_tensors_hooks``, which compiled code and vmap use, raise).
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

_MAX_NODES = 200_000  # a graph walk's bound (a large model's step has tens of thousands of nodes)


@dataclass(frozen=True)
class Held:
    """One returned tensor alive when backward began, not saved by autograd."""

    name: str  # its place in the output: "logits", "past_key_values[0][1]", "[0]"
    shape: tuple[int, ...]
    dtype: str
    bytes: int


def _tensors(value: Any, name: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(place, tensor) of every tensor in a forward's output (mappings, sequences, transformers outputs)."""
    if depth > 6:
        return
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensors(v, f"{name}.{k}" if name else str(k), depth + 1)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{name}[{i}]", depth + 1)


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the tensor's storage; None for a tensor without one (sparse, meta)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):
        return None


def _raw_saved(node: Any) -> Iterator[Any]:
    """The ``SavedTensor`` objects one autograd node holds (its ``_raw_saved_*`` fields; a custom Function's
    ``_raw_saved_tensors``), read without unpacking them."""
    for name in dir(node):
        if not name.startswith("_raw_saved_"):
            continue
        try:
            value = getattr(node, name)
        except Exception:  # noqa: BLE001 - a field freed already
            continue
        yield from value if isinstance(value, (tuple, list)) else (value,)


def _saved_by(items: list[Any]) -> Iterator[torch.Tensor]:
    """The tensors among one node's ``SavedTensor`` objects (:func:`_raw_saved`), read without unpacking them.

    A ``SavedTensor``'s ``data`` is the tensor itself when no hook packed it. One a saved-tensor hook
    packed (non-reentrant activation checkpointing, CPU offloading) is the hook's to unpack, once:
    reading the ``_saved_*`` field unpacked it, which re-ran a checkpointed region and made the loop's
    own backward fail ("Unpack is being triggered for a tensor that was already unpacked once"). Those
    are skipped, as is every field of a torch that does not say whether a hook packed it.
    """
    for item in items:
        if getattr(item, "unpack_hook", True) is not None:
            continue  # packed by a hook, or not a SavedTensor this torch describes
        with contextlib.suppress(Exception):
            data = item.data
            if isinstance(data, torch.Tensor):
                yield data


def _checkpointed(node: Any, items: list[Any]) -> bool:
    """Whether the node's saved tensors (``items``) come back by recomputation (torch.utils.checkpoint): the
    node of a reentrant checkpoint, or a saved tensor packed by the non-reentrant checkpoint's hook."""
    return type(node).__name__ == "CheckpointFunctionBackward" or any(
        getattr(getattr(item, "unpack_hook", None), "__module__", "") == "torch.utils.checkpoint" for item in items)


def saved_storages(roots: list[Any], recomputes: list[bool] | None = None) -> set[int]:
    """Storage pointers of every tensor autograd saved in the graph behind ``roots`` (autograd nodes);
    ``recomputes`` gets True appended when the graph recomputes checkpointed activations in backward."""
    seen: set[int] = set()
    out: set[int] = set()
    stack = [r for r in roots if r is not None]
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        items = list(_raw_saved(node))  # each node's fields read once, for both questions
        for t in _saved_by(items):
            found = _storage(t)
            if found is not None:
                out.add(found[0])
        if recomputes is not None and not recomputes and _checkpointed(node, items):
            recomputes.append(True)
        stack.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return out


class HeldOutputs:
    """Within the block: which of the model's returned tensors are alive, unsaved, as backward begins."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.held: list[Held] | None = None  # None: backward never reached what the model returned
        # Whether the step's backward recomputes checkpointed activations (torch.utils.checkpoint, a
        # Hugging Face model's gradient_checkpointing_enable()); None: backward was not reached.
        self.recomputes: bool | None = None
        self._outputs: list[tuple[str, weakref.ref[torch.Tensor]]] = []
        self._hooks: list[Any] = []

    @contextlib.contextmanager
    def watching(self) -> Iterator["HeldOutputs"]:
        handle = self.model.register_forward_hook(self._returned, always_call=True)
        try:
            yield self
        finally:
            handle.remove()
            self._unhook()

    # Both hooks run inside the user's step: whatever fails there is a missing figure, never an error of theirs.
    def _returned(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._outputs:  # the step's first forward (a later micro-batch's output is its own story)
            return
        with contextlib.suppress(Exception):
            found = list(_tensors(output, ""))
            self._outputs = [(name, weakref.ref(t)) for name, t in found]
            nodes = {id(t.grad_fn): t.grad_fn for _, t in found if t.grad_fn is not None}
            self._hooks = [n.register_prehook(self._backward_reached) for n in nodes.values()]

    def _backward_reached(self, grad_outputs: Any) -> None:
        if self.held is None:
            with contextlib.suppress(Exception):
                # The node backward reached: the graph's root even where the loop let go of what the model
                # returned (``model(x).flatten(0, 1)`` keeps a view, not the output's Python object).
                current = getattr(torch._C, "_current_autograd_node", lambda: None)()
                self.held = self._judge(current)
            self._unhook()

    def _unhook(self) -> None:
        for h in self._hooks:
            with contextlib.suppress(Exception):
                h.remove()
        self._hooks = []

    def _judge(self, current: Any = None) -> list[Held]:
        alive = [(name, t) for name, ref in self._outputs if (t := ref()) is not None]
        recomputes: list[bool] = []
        roots = [t.grad_fn for _, t in alive] + [current]
        counted = saved_storages(roots, recomputes)
        self.recomputes = bool(recomputes) if any(r is not None for r in roots) else None
        out = []
        for name, t in alive:
            found = _storage(t)
            if t.numel() <= 1 or found is None or found[0] in counted:
                continue  # a scalar (the loss the loop calls backward on), or saved by autograd
            counted.add(found[0])
            out.append(Held(name or "output", tuple(t.shape), str(t.dtype).removeprefix("torch."), found[1]))
        return out
