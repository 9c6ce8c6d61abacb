"""Kernels of compiled graphs in a trace, named by the blocks they came from.

A compiled graph runs as one ``## Call CompiledFxGraph <key> ##`` range whose direct children are
its kernels: inductor's generated C++ kernels (``graph_<n>_cpp_fused_*`` ranges, when inductor was
told to record them) and extern calls (``aten::mm``, ``aten::addmm``, ...) and fallback ops (``aten::_scaled_dot_product_flash_attention_for_cpu``
on the CPU), plus buffer allocations.
The compile-time record (``compiled_kernels.json``, measure/compiled_kernels.py) lists each graph's
kernels in the order its code calls them, with the blocks whose source ops each contains.

A call is matched to the recorded graph whose C++ kernel names, in order, are those of the call;
then its C++ kernels are matched by name and its extern calls in order (the k-th ``aten::mm`` child
is the graph's k-th ``mm`` extern call). A call that matches no graph, or an extern call past the
record, is left unnamed (its time stays in the phase's ``other``).

A kernel whose ops come from several blocks (a fused kernel) is split among them by the ``shares``
compile time recorded (their FLOPs in it, else the bytes their ops write; see
measure/compiled_kernels.py); a record without shares splits evenly. Blocks with a zero share take
nothing; a kernel with two or more blocks left is *fused*, and keeps its label, the blocks joined
with ``+`` (``mlp.fc+mlp.act``), for the run's table of fused kernels.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import parents

GRAPH_CALL_PREFIX = "## Call CompiledFxGraph"
FUSED_SEP = "+"
_CPP_KERNEL = re.compile(r"^graph_\d+_(?P<name>cpp_\w+)$")


def runs_as_op(name: str) -> bool:
    """True for a recorded kernel that runs as an aten op in the trace, not as a generated C++ kernel.

    Extern kernels (``extern_kernels.mm``) and the ops inductor falls back to because it has no
    lowering for them, which it calls as ``torch.ops.aten.<op>.default`` (the CPU's flash attention
    ``_scaled_dot_product_flash_attention_for_cpu`` and its backward): both are aten ops under the
    graph call, matched in order like extern calls.
    """
    return name.startswith(("extern_kernels.", "torch.ops."))


def extern_op_name(name: str) -> str:
    """The profiler's op name for an extern kernel record: 'mm' -> 'aten::mm'."""
    base = name.removeprefix("extern_kernels.").removeprefix("torch.ops.").removesuffix(".default")
    if "::" in base:
        return base
    return base.replace("aten.", "aten::", 1) if base.startswith("aten.") else f"aten::{base}"


@dataclass(frozen=True)
class KernelOwner:
    """Who owns one compiled kernel's time: its blocks and their shares (summing to 1)."""

    kernel: str  # the kernel's name in the record (``cpp_fused_gelu_view_5``, ``addmm``)
    blocks: tuple[str, ...]
    shares: tuple[float, ...]
    basis: str  # what the shares weigh: "flops", "bytes" or "even"

    @property
    def fused(self) -> bool:
        """True when the kernel's time is split among two or more blocks."""
        return len(self.blocks) > 1

    @property
    def label(self) -> str:
        """The blocks joined with '+': ``mlp.fc+mlp.act``."""
        return FUSED_SEP.join(self.blocks)

    @property
    def main(self) -> str:
        """The block with the largest share (the first on a tie)."""
        return self.blocks[max(range(len(self.blocks)), key=lambda i: (self.shares[i], -i))]


def _extern(k: dict[str, Any]) -> bool:
    # Records written before fallback ops were marked extern name them torch.ops.aten.<op>.default.
    return bool(k.get("extern")) or runs_as_op(str(k.get("name", "")))


def _owner(k: dict[str, Any]) -> KernelOwner | None:
    """A record's kernel as its owner: blocks with a positive share, shares summing to 1."""
    blocks = [str(b) for b in k.get("blocks", [])]
    if not blocks:
        return None
    raw = k.get("shares")
    basis = str(k.get("basis", "even"))
    if not isinstance(raw, list) or len(raw) != len(blocks):
        raw, basis = [1.0] * len(blocks), "even"
    shares = [float(x) if isinstance(x, (int, float)) and x > 0 else 0.0 for x in raw]
    total = sum(shares)
    if total <= 0:
        shares, total, basis = [1.0] * len(blocks), float(len(blocks)), "even"
    kept = [(b, x / total) for b, x in zip(blocks, shares) if x > 0]
    return KernelOwner(str(k.get("name", "")), tuple(b for b, _ in kept), tuple(x for _, x in kept), basis)


def kernel_blocks(table: TraceTable, graphs: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Row of each kernel event of a compiled graph call -> its block (or fused blocks, ``a+b``) name."""
    return {r: o.label for r, o in kernel_owners(table, graphs).items()}


def kernel_owners(table: TraceTable, graphs: Sequence[dict[str, Any]]) -> dict[int, KernelOwner]:
    """Row of each kernel event of a compiled graph call -> its blocks and their shares."""
    ev = table.event_cols
    name_col = table.names()
    host = kinds.host_mask(table)
    calls = np.flatnonzero(host & kinds.name_mask(table, lambda n: n.startswith(GRAPH_CALL_PREFIX)))
    if calls.size == 0 or not graphs:
        return {}
    by_signature: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for g in graphs:
        recorded = list(g.get("kernels", []))
        by_signature.setdefault(tuple(k["name"] for k in recorded if not _extern(k)), recorded)
    par = parents(table)
    ts = np.asarray(ev["ts"], dtype=float)
    children: dict[int, list[int]] = defaultdict(list)
    call_set = set(calls.tolist())
    for r in np.flatnonzero(host).tolist():
        p = int(par[r])
        if p in call_set:
            children[p].append(r)
    out: dict[int, KernelOwner] = {}
    for call in calls.tolist():
        kids = sorted(children.get(call, []), key=lambda r: ts[r])
        cpp = [(r, m["name"]) for r in kids if (m := _CPP_KERNEL.match(name_col[r]))]
        kernels = by_signature.get(tuple(n for _, n in cpp))
        if kernels is None:
            continue
        for (r, _), k in zip(cpp, [k for k in kernels if not _extern(k)]):
            owner = _owner(k)
            if owner:
                out[r] = owner
        pending = [r for r in kids if not _CPP_KERNEL.match(name_col[r])]
        i = 0
        for k in (k for k in kernels if _extern(k)):
            want = extern_op_name(k["name"])
            while i < len(pending) and name_col[pending[i]] != want:
                i += 1
            if i == len(pending):
                break  # the record and the trace disagree from here on: leave the rest unnamed
            owner = _owner(k)
            if owner:
                out[pending[i]] = owner
            i += 1
    return out
