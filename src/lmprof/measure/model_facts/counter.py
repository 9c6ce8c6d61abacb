"""One pass of a model on the meta device, counted: FLOPs and bytes per block, live and saved bytes.

:class:`FactsCounter` extends the block counter of :mod:`lmprof.measure.flops` (torch's FLOP
formulas, charged to the ``lmprof:<block>`` scope open in forward or to the block of the autograd
node running in backward) with what the describer also needs of every op:

* **bytes moved**: each op one kernel (eager execution): the parameters it reads (once per block
  and pass: ``weight_bytes``) and every other tensor it reads or writes (``act_bytes``); ops that
  only view or allocate move nothing;
* **live bytes**: every storage an op creates is counted from its creation until it is freed (a
  weak reference to the storage), so the pass's highest level above the parameters, and what was
  alive then, are known;
* **saved bytes**: what autograd keeps for backward (:func:`saved_tensors`), each storage once,
  parameters left out, charged to the block that saved it.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch

from lmprof.measure.flops import BlockCounter

# Ops that view, alias or allocate without writing: no bytes move.
_NO_TRAFFIC = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "split",
    "split_with_sizes", "unsqueeze", "squeeze", "detach", "alias", "lift_fresh", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "as_strided", "unbind", "_reshape_alias", "view_as",
    "expand_as", "unfold", "diagonal", "narrow", "_local_scalar_dense", "item", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "resize_",
}


def _sid(t: torch.Tensor) -> int:
    """An id of the storage under ``t`` (views of one storage share it)."""
    return int(t.untyped_storage()._cdata)


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs (nested tuples, lists and dicts): a plain walk, as
    torch's pytree flattening cost a tenth of a 70B-class model's description."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for x in tree for t in _tensors(x)]
    if isinstance(tree, dict):
        return [t for x in tree.values() for t in _tensors(x)]
    return []


class FactsCounter(BlockCounter):
    """FLOPs, bytes and live storages of every op, per (block, phase); see the module docstring."""

    def __init__(self, params: set[int], device: str = "meta") -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init_subclass__ is unannotated
        self.params = params  # storage ids of the parameters (and buffers): never activations
        self.device = device  # tensors of other devices (inputs made elsewhere) are not counted
        self.weights: dict[tuple[str, str], set[int]] = defaultdict(set)
        self.weight_bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.act_bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.matmul_params: set[int] = set()  # parameter storages read by an op with a FLOP formula
        # (block, phase, storage key, bytes) of every non-parameter input: cache reads are told apart after the pass.
        self.reads: list[tuple[str, str, int, int]] = []
        # Live storages created in the pass: the event log (serial, +bytes or -bytes) in op order; the serial
        # is the index of the storage's creation event.
        self.events: list[tuple[int, int]] = []
        self._alive: dict[int, tuple[int, int]] = {}  # storage id -> (serial, bytes) while alive
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._traffic: dict[Any, tuple[bool, bool]] = {}  # op -> (moves bytes, has a FLOP formula)

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, block: str,
              phase: str) -> None:
        traffic = self._traffic.get(func)
        if traffic is None:
            traffic = self._traffic[func] = (str(func._overloadpacket).split(".")[-1] not in _NO_TRAFFIC,
                                             func._overloadpacket in self.formulas)
        key = (block, phase)
        outs = _tensors(out)
        if traffic[0]:
            counted = traffic[1]
            for t in _tensors((args, kwargs)):
                if t.device.type != self.device:
                    continue
                sid = _sid(t)
                if sid in self.params:
                    if counted:
                        self.matmul_params.add(sid)
                    if sid not in self.weights[key]:
                        self.weights[key].add(sid)
                        self.weight_bytes[key] += t.untyped_storage().nbytes()
                else:
                    nbytes = t.numel() * t.element_size()
                    self.act_bytes[key] += nbytes
                    self.reads.append((block, phase, self.key_of(sid), nbytes))
            self.act_bytes[key] += sum(t.numel() * t.element_size() for t in outs if t.device.type == self.device)
        for t in outs:
            self._track(t)

    def key_of(self, sid: int) -> int:
        """A storage's key for the whole pass: its serial when the pass created it (storage addresses are
        reused once freed), else ``-1 - sid`` for a storage that existed before (the parameters, a cache)."""
        alive = self._alive.get(sid)
        return alive[0] if alive is not None else -1 - sid

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type != self.device:
            return
        storage = t.untyped_storage()
        sid = int(storage._cdata)
        if sid in self._alive or sid in self.params:
            return
        nbytes = storage.nbytes()
        serial = len(self.events)
        self._alive[sid] = (serial, nbytes)
        self.events.append((serial, nbytes))
        self._refs[sid] = weakref.ref(storage, self._on_free(sid))

    def _on_free(self, sid: int) -> Callable[[object], None]:
        return lambda _ref: self._freed(sid)

    def _freed(self, sid: int) -> None:
        alive = self._alive.pop(sid, None)
        self._refs.pop(sid, None)
        if alive is not None:
            self.events.append((alive[0], -alive[1]))

    def mark(self) -> int:
        """A position in the event log (to tell forward from backward afterwards)."""
        return len(self.events)

    def peak(self, of: set[int] | None = None) -> tuple[int, int, int]:
        """(highest live bytes, event index where it was reached, live bytes then of the storages whose
        keys are in ``of``: see :meth:`key_of`)."""
        level = best = best_at = 0
        alive: dict[int, int] = {}
        best_alive: dict[int, int] = {}
        for i, (serial, delta) in enumerate(self.events):
            if delta > 0:
                alive[serial] = delta
            elif alive.pop(serial, None) is None:
                continue
            level += delta
            if level > best:
                best, best_at = level, i
                if of is not None:
                    best_alive = dict(alive)
        return best, best_at, sum(n for serial, n in best_alive.items() if of is not None and serial in of)


@contextlib.contextmanager
def saved_tensors(params: set[int], current: Any, key_of: Callable[[int], int]) -> Iterator[dict[int, tuple[str, int]]]:
    """Record what autograd keeps for backward: storage key -> (block that saved it first, storage bytes).

    Each storage once, however many views of it are saved; parameters and buffers left out (they are
    the parameters' memory, not activations). ``current()`` names the block open in forward; ``key_of``
    is the counter's key of a storage (:meth:`FactsCounter.key_of`), which tells a storage from a later
    one at the same address. On leaving, only the storages still alive stay: a node whose output was
    dropped in forward (a router's scores, used only for their indices) frees what it saved, so that is
    not held for backward. Keyed by address, such a freed storage's address taken by a later saved one
    hid the later one: the estimate moved by up to 4% from run to run with the heap's state.
    """
    saved: dict[int, tuple[str, int]] = {}
    refs: dict[int, weakref.ref[Any]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            sid = _sid(t)
            if sid in params:
                return t
            key = key_of(sid)
            if key not in saved:
                storage = t.untyped_storage()
                saved[key] = (current(), storage.nbytes())
                refs[key] = weakref.ref(storage)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved
    for key in [k for k, ref in refs.items() if ref() is None]:
        del saved[key]
