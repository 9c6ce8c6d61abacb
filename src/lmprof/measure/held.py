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


def _saved_by(node: Any) -> Iterator[torch.Tensor]:
    """The tensors one autograd node saved for backward."""
    names = [n for n in dir(node) if n.startswith("_saved_")]
    values: list[Any] = []
    for n in names:
        with contextlib.suppress(Exception):  # a field freed already, or not a tensor
            values.append(getattr(node, n))
    with contextlib.suppress(Exception):  # a custom autograd.Function's context
        values.extend(getattr(node, "saved_tensors", ()) or ())
    for v in values:
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(item, torch.Tensor):
                yield item


def saved_storages(roots: list[Any]) -> set[int]:
    """Storage pointers of every tensor autograd saved in the graph behind ``roots`` (autograd nodes)."""
    seen: set[int] = set()
    out: set[int] = set()
    stack = [r for r in roots if r is not None]
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for t in _saved_by(node):
            found = _storage(t)
            if found is not None:
                out.add(found[0])
        stack.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return out


class HeldOutputs:
    """Within the block: which of the model's returned tensors are alive, unsaved, as backward begins."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.held: list[Held] | None = None  # None: backward never reached what the model returned
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
                self.held = self._judge()
            self._unhook()

    def _unhook(self) -> None:
        for h in self._hooks:
            with contextlib.suppress(Exception):
                h.remove()
        self._hooks = []

    def _judge(self) -> list[Held]:
        alive = [(name, t) for name, ref in self._outputs if (t := ref()) is not None]
        counted = saved_storages([t.grad_fn for _, t in alive])
        out = []
        for name, t in alive:
            found = _storage(t)
            if t.numel() <= 1 or found is None or found[0] in counted:
                continue  # a scalar (the loss the loop calls backward on), or saved by autograd
            counted.add(found[0])
            out.append(Held(name or "output", tuple(t.shape), str(t.dtype).removeprefix("torch."), found[1]))
        return out
