"""Tensors a training loop keeps alive into backward beyond what autograd saved: the evidence behind a
measured-minus-estimated memory difference.

The analytic estimate counts what autograd saves for backward, and the logits only while the loss is
computed. A loop written ``outputs = model(x, labels=y); outputs.loss.backward()`` keeps ``outputs``,
and with it the (batch, seq, vocab) logits, alive through backward: the measured activations are
larger by exactly those bytes. :class:`HeldOutputs` finds them on the figures step, from the tensors
themselves: it keeps weak references to the tensors the model's forward returned, records the
storage of every tensor autograd saves (identity saved-tensor hooks: nothing is changed or copied),
and, when backward first reads a saved tensor, lists the returned tensors still alive whose storage
autograd did not save. Weak references only: the loop frees what it frees.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch


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


class HeldOutputs:
    """Within the block: which of the model's returned tensors are alive, unsaved, as backward begins."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.held: list[Held] | None = None  # None: no backward read a saved tensor in the block
        self._outputs: list[tuple[str, weakref.ref[torch.Tensor]]] = []
        self._saved: set[int] = set()

    @contextlib.contextmanager
    def watching(self) -> Iterator["HeldOutputs"]:
        handle = self.model.register_forward_hook(self._returned, always_call=True)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            handle.remove()

    def _returned(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._outputs:  # the step's first forward (a later micro-batch's output is its own story)
            return
        self._outputs = [(name, weakref.ref(t)) for name, t in _tensors(output, "")]

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        found = _storage(t)
        if found is not None:
            self._saved.add(found[0])
        return t

    def _unpack(self, t: torch.Tensor) -> torch.Tensor:
        if self.held is None:
            self.held = self._judge()
        return t

    def _judge(self) -> list[Held]:
        out, counted = [], set(self._saved)
        for name, ref in self._outputs:
            t = ref()
            found = _storage(t) if t is not None else None
            if t is None or t.numel() <= 1 or found is None or found[0] in counted:
                continue  # gone, a scalar (the loss the loop calls backward on), or saved by autograd
            counted.add(found[0])
            out.append(Held(name or "output", tuple(t.shape), str(t.dtype).removeprefix("torch."), found[1]))
        return out
