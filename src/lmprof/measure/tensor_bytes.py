"""Exact bytes of live tensors: parameters, gradients, optimizer state, each storage counted once.

Tied weights and views share a storage, so bytes are counted by (storage, byte range), never by
tensor. Gradients are read by a post-accumulate hook during backward (the step frees them again in
``zero_grad``).
"""
from __future__ import annotations

import contextlib
import resource
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from lmprof.workloads.stepping import params as stepped


Range = tuple[Any, int, int]  # (storage key, first byte, end byte)


def tensor_range(t: torch.Tensor) -> Range:
    """The bytes of its storage a tensor can reach: (storage key, start, end).

    A distributed tensor (FSDP2's DTensor) counts its local shard: what this rank holds.
    A storage that was freed (FSDP's resharded full parameters) holds no bytes.
    """
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        t = to_local()
    if t.is_meta:  # no storage: a weight offloaded between forwards (accelerate's device_map) holds nothing here
        return (id(t), 0, 0)
    try:
        st = t.untyped_storage()
        key = st.data_ptr() or id(st)  # meta / zero-size storages have no address
    except RuntimeError:  # "invalid python storage": freed under us, nothing held
        return (id(t), 0, 0)
    size = t.element_size()
    if t.numel() == 0:
        return (key, 0, 0)
    # A real tensor's offset and sizes are ints (torch types them int | SymInt for tracing).
    start = int(t.storage_offset()) * size
    # The furthest element a strided view reaches (strides may be 0 or permuted).
    last = sum((int(n) - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return (key, start, start + (last + 1) * size)


def tensor_ranges(t: torch.Tensor) -> list[Range]:
    """:func:`tensor_range` of each storage a tensor holds: one for a strided tensor; a sparse one (the
    gradient of ``nn.Embedding(sparse=True)``) holds its indices and its values, and has no storage of its own."""
    if t.layout == torch.sparse_coo:
        return [tensor_range(t._indices()), tensor_range(t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        compressed, plain = ((t.crow_indices(), t.col_indices()) if t.layout in (torch.sparse_csr, torch.sparse_bsr)
                             else (t.ccol_indices(), t.row_indices()))
        return [tensor_range(compressed), tensor_range(plain), tensor_range(t.values())]
    return [tensor_range(t)]


def ranges_bytes(ranges: Iterable[Range]) -> int:
    """Bytes covered by ranges, overlaps counted once (tied weights, views of one storage)."""
    by_key: dict[Any, list[tuple[int, int]]] = {}
    for key, lo, hi in ranges:
        if hi > lo:
            by_key.setdefault(key, []).append((lo, hi))
    total = 0
    for spans in by_key.values():
        spans.sort()
        cur_lo, cur_hi = spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                total += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        total += cur_hi - cur_lo
    return total


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes held by tensors, each storage byte counted once."""
    return ranges_bytes(r for t in tensors for r in tensor_ranges(t))


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


@dataclass(frozen=True)
class StaticMemory:
    """Exact bytes of the model and optimizer at one moment.

    ``optimizer`` includes every tensor in ``optimizer.state``: AdamW's two moments per parameter
    and its 0-dim ``step`` counter per parameter (``optimizer_scalars``; 4 B each, kept on the CPU
    even for CUDA parameters unless ``capturable``/``fused``).
    """

    params: int
    buffers: int
    grads: int
    optimizer: int
    optimizer_scalars: int
    n_params: int
    offloaded: int = 0  # parameters on the meta device (no storage here: offloaded between forwards)

    @property
    def total(self) -> int:
        return self.params + self.buffers + self.grads + self.optimizer


def trained_params(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()) -> list[torch.Tensor]:
    """The model's parameters, then every other one ``optimizers`` step (a module trained with the model that the
    loop calls apart from it), each once; not a tensor of another dtype than the model's, which is an fp32 master
    copy an optimizer keeps of 16-bit weights (apex O2, DeepSpeed's bf16 optimizer), not a parameter."""
    params: list[torch.Tensor] = list(model.parameters())
    ours, dtypes = {id(p) for p in params}, {p.dtype for p in params}
    for p in (p for opt in optimizers for p in stepped(opt)):
        if id(p) not in ours and (not dtypes or p.dtype in dtypes):
            ours.add(id(p))
            params.append(p)
    return params


def static_memory(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()) -> StaticMemory:
    """Exact bytes of parameters, buffers, current gradients and the state of every optimizer given
    (a model trained by several, as Muon for its matrices and AdamW for the rest, holds all their states).
    The parameters are the model's and every other one those optimizers step (a module trained with the
    model that the loop calls apart from it: an encoder-decoder's other half), each once."""
    params = trained_params(model, optimizers)
    state = [t for opt in optimizers for t in _state_tensors(opt)]
    return StaticMemory(
        params=tensor_bytes(params),
        buffers=tensor_bytes(model.buffers()),
        grads=tensor_bytes(p.grad for p in params if p.grad is not None),
        optimizer=tensor_bytes(state),
        optimizer_scalars=tensor_bytes(t for t in state if t.dim() == 0),
        n_params=sum(p.numel() for p in params),
        offloaded=sum(p.numel() for p in params if p.is_meta),
    )


@contextlib.contextmanager
def record_grads(model: torch.nn.Module,
                 optimizers: Sequence[torch.optim.Optimizer] = ()) -> Iterator[dict[int, list[Range]]]:
    """Within the block, remember the storage range of every parameter's final .grad (the model's and those
    ``optimizers`` step: :func:`trained_params`): as backward
    accumulates it, and, for one no backward accumulated, as an optimizer in ``optimizers`` steps
    (a loop that sets ``p.grad`` itself from ``torch.autograd.grad``).

    Only the range is kept, never the tensor, so the step frees its gradients as it always would.
    """
    seen: dict[int, list[Range]] = {}
    handles = []
    params = [p for p in trained_params(model, optimizers) if p.requires_grad]

    def remember(param: torch.Tensor) -> None:
        if param.grad is not None:
            # in the user's backward or optimizer step: a gradient not read is a missing byte count
            with contextlib.suppress(Exception):
                seen[id(param)] = tensor_ranges(param.grad)

    for p in params:
        handles.append(p.register_post_accumulate_grad_hook(remember))  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    def set_by_the_loop(*_: Any) -> None:
        for p in params:
            if id(p) not in seen:
                remember(p)

    handles += [opt.register_step_pre_hook(set_by_the_loop) for opt in optimizers]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def peak_rss_bytes() -> int:
    """The process's peak resident set size in bytes (whole process, never decreases)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes, Linux KiB
