"""Which blocks each kernel of a compiled graph came from, from inductor's own provenance records.

With ``torch._inductor.config.trace.provenance_tracking_level`` on, inductor keeps, for every kernel it
generates (fused C++/Triton kernels and extern calls such as mm/addmm), the stack traces of the FX
nodes it contains (``torch._inductor.debug.create_kernel_information_json``). Each stack trace ends
in the model's source; for the built-in GPT a source line lies inside a ``with scope("<block>")``
statement of workloads/gpt.py, which names the block. A kernel whose nodes come from several blocks
fused them; its name maps to all of them, in the forward pass's block order.

**Shares of a fused kernel.** Inductor also keeps, per kernel, the names of the post-grad FX nodes it
contains (``torch._inductor.debug._inductor_triton_kernel_to_post_grad_node_info``); when the
artifact is emitted, the graph being compiled is ``V.graph`` and its post-grad module
(``V.graph.orig_gm``) has those nodes, each with its target, its output's fake tensor
(``meta["val"]``) and its own stack trace. So every kernel gets, per block, a weight:

* ``flops``: the FLOPs of the block's nodes in the kernel, from ``torch.utils.flop_counter``'s
  formula for each node's op on the nodes' fake tensors (the formulas FlopCounterMode uses);
* ``bytes``: the bytes of the block's nodes' outputs (numel x element size), views excluded (they
  move nothing).

A kernel's ``shares`` are its blocks' FLOPs over the kernel's FLOPs when its nodes have FLOPs
(``basis: flops``: matmuls, attention), else their output bytes (``basis: bytes``: pointwise and
reduction fusions), else even (``basis: even``: no node could be weighed). So a block whose only ops
in a kernel with FLOPs are pointwise gets no share of it (inductor fuses a decode step's one-row
bmm with the softmax around it: the softmax's time goes to attn.scores and attn.av). Nodes outside every scope
weigh nothing: a kernel's time goes to its named blocks only. A node inductor recomputes inside
several kernels (it does, e.g. a layer norm recomputed in the next kernel) weighs in each.

The mapping is taken at compile time and written next to the trace as ``compiled_kernels.json``;
trace/compiled.py reads it to give compiled kernels' time to blocks.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._logging._internal import trace_log
from torch.utils._pytree import tree_map

from lmprof import names
from lmprof.measure.flops import formulas
from lmprof.trace.compiled import runs_as_op
from lmprof.workloads import gpt as gpt_module

# The FLOP formulas lmprof counts with (torch's, and the CPU attention ops'), for weighing a kernel's nodes.
_FORMULAS = formulas()
# One frame of a Python stack trace as FX node meta stores it.
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclass(frozen=True)
class Region:
    """Lines ``first..last`` of a file are the body of ``with scope(name)``."""

    first: int
    last: int
    name: str


@lru_cache(maxsize=8)
def scope_regions(path: str) -> tuple[Region, ...]:
    """Every ``with scope("<name>")`` body in the Python file at ``path`` (innermost last)."""
    tree = ast.parse(Path(path).read_text())
    out: list[Region] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "scope"
                    and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                out.append(Region(node.body[0].lineno, node.end_lineno or node.body[-1].lineno, call.args[0].value))
    # Narrower regions first, so the innermost scope around a line wins.
    return tuple(sorted(out, key=lambda r: r.last - r.first))


def block_of_stack(stack: str, source: str) -> str | None:
    """The block of the innermost frame of ``stack`` in file ``source`` that lies inside a scope."""
    regions = scope_regions(source)
    frames = [(m["file"], int(m["line"])) for m in _FRAME.finditer(stack)]
    for file, line in reversed(frames):  # innermost frame last in a Python stack trace
        if file != source:
            continue
        hit = next((r.name for r in regions if r.first <= line <= r.last), None)
        if hit is not None:
            return hit
    return None


def _base_name(name: str) -> tuple[str, bool]:
    """('cpp_fused_x_0', False) from 'cpp_fused_x_0:3'; ('mm', True) from 'extern_kernels.mm:2';
    ('torch.ops.aten.x.default', True) for an op inductor falls back to (it runs as an aten op too)."""
    base = re.sub(r":\d+$", "", name)
    return base.removeprefix("extern_kernels."), runs_as_op(base)


def _handle(name: str) -> int:
    m = re.search(r":(\d+)$", name)
    return int(m.group(1)) if m else 0


@dataclass
class NodeInfo:
    """What a kernel's post-grad FX node weighs: its source stack and its FLOPs and output bytes.
    ``name``: the node's name in its graph (one node may be an origin of several kernels)."""

    stack: str
    flops: float
    bytes: float
    name: str = ""


def _hint(x: Any) -> float:
    """A concrete number for an int, float or (backed) symbolic size; 0 when it has no hint."""
    if isinstance(x, (int, float)):
        return float(x)
    node = getattr(x, "node", None)
    hint = getattr(node, "hint", None)
    return float(hint) if isinstance(hint, (int, float)) else 0.0


def _out_bytes(val: Any) -> float:
    if isinstance(val, torch.Tensor):
        return _hint(val.numel()) * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(_out_bytes(v) for v in val)
    return 0.0


def node_info(node: torch.fx.Node) -> NodeInfo:
    """A post-grad FX node's stack trace, FLOPs (flop_counter's formula on its fake tensors) and
    output bytes (0 for views: they alias their input)."""
    target = node.target
    val = node.meta.get("val")
    flops = 0.0
    packet = getattr(target, "overloadpacket", None)
    formula = _FORMULAS.get(packet) if packet is not None else None
    if formula is not None:
        def fake(a: Any) -> Any:
            return a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        with contextlib.suppress(Exception):  # a formula that cannot read these args weighs nothing
            flops = _hint(formula(*tree_map(fake, node.args), **tree_map(fake, node.kwargs), out_val=val))
    is_view = bool(getattr(target, "is_view", False))
    return NodeInfo(str(node.meta.get("stack_trace") or ""), flops, 0.0 if is_view else _out_bytes(val), node.name)


def _weighed(blocks: list[str], nodes: list[NodeInfo], source: str) -> dict[str, Any]:
    """Per block FLOPs and bytes of ``nodes``, and the kernel's shares (see the module doc)."""
    flops = dict.fromkeys(blocks, 0.0)
    nbytes = dict.fromkeys(blocks, 0.0)
    for n in nodes:
        b = block_of_stack(n.stack, source)
        if b in flops:
            flops[b] += n.flops
            nbytes[b] += n.bytes
    if sum(flops.values()) > 0:
        basis, weight = "flops", flops
    elif sum(nbytes.values()) > 0:
        basis, weight = "bytes", nbytes
    else:
        basis, weight = "even", dict.fromkeys(blocks, 1.0)
    total = sum(weight.values())
    return {"flops": [flops[b] for b in blocks], "bytes": [nbytes[b] for b in blocks], "basis": basis,
            "shares": [weight[b] / total if total else 0.0 for b in blocks]}


def graph_kernels(stacks: dict[str, list[str]], source: str | None = None,
                  nodes: dict[str, list[NodeInfo]] | None = None) -> list[dict[str, Any]]:
    """One compiled graph's kernels in the order its code calls them, each with its blocks and shares.

    ``stacks`` is inductor's kernel -> stack traces record for one graph; a kernel's ``:<handle>``
    suffix numbers kernels in code-generation order, which is the order the graph runs them.
    ``nodes``: kernel -> its post-grad nodes (weights of its blocks); without them shares are even.
    """
    source = source or inspect.getsourcefile(gpt_module) or ""
    order = {b: i for i, b in enumerate(names.FORWARD_BLOCKS)}
    # An op inductor calls (a matmul, SDPA) is computed by that extern call; a generated kernel that
    # also lists it among its origins (a fused pointwise kernel reading its outputs:
    # cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_sum_... on the CPU) does not
    # compute it again, so its FLOPs are counted once, in the call.
    called = {n.name for k, ns in (nodes or {}).items() if _base_name(k)[1] for n in ns if n.name}
    out = []
    for name in sorted(stacks, key=_handle):
        base, extern = _base_name(name)
        blocks: list[str] = []
        kernel_nodes = (nodes or {}).get(name, [])
        if not extern:
            kernel_nodes = [dataclasses.replace(n, flops=0.0) if n.name in called else n for n in kernel_nodes]
        for stack in [*stacks[name], *(n.stack for n in kernel_nodes)]:
            b = block_of_stack(stack, source)
            if b is not None and b not in blocks:
                blocks.append(b)
        blocks.sort(key=lambda b: order.get(b, len(order)))
        out.append({"name": base, "extern": extern, "blocks": blocks, **_weighed(blocks, kernel_nodes, source)})
    return out


def _current_graph_nodes() -> dict[str, list[NodeInfo]]:
    """Kernel -> its post-grad nodes, for the graph inductor is compiling now (empty if unknown)."""
    from torch._inductor import debug as inductor_debug
    from torch._inductor.virtualized import V

    try:
        gm = V.graph.orig_gm
    except (AttributeError, AssertionError):  # no graph handler set: weigh nothing, shares are even
        return {}
    by_name = {n.name: n for n in gm.graph.nodes}
    kernel_nodes = getattr(inductor_debug, "_inductor_triton_kernel_to_post_grad_node_info", {})
    return {k: [node_info(by_name[n]) for n in ns if n in by_name] for k, ns in kernel_nodes.items()}


class _Artifacts(logging.Handler):
    """Keeps the payloads of inductor's per-graph 'kernel stack traces' structured-log artifact."""

    NAME = "inductor_provenance_tracking_kernel_stack_traces"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.graphs: list[tuple[dict[str, list[str]], dict[str, list[NodeInfo]]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None) or {}
        art = meta.get("artifact") if isinstance(meta, dict) else None
        if isinstance(art, dict) and art.get("name") == self.NAME:
            with contextlib.suppress(ValueError, TypeError):
                # emitted while the graph is still being compiled: its nodes are there to weigh now
                self.graphs.append((json.loads(getattr(record, "payload", "") or "{}"), _current_graph_nodes()))


class KernelRecorder:
    """While open, inductor records each kernel's source nodes and names its C++ kernels in traces.

    ``graphs()`` gives every graph compiled meanwhile (forward and backward): its kernels in call
    order with their blocks. Needs the built-in GPT's scopes in the source (other models map to none).
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._handler = _Artifacts()

    def __enter__(self) -> "KernelRecorder":
        self._stack.enter_context(inductor_config.patch(
            {"trace.provenance_tracking_level": 1, "cpp.enable_kernel_profile": True,
             # a cached graph skips code generation, and with it the provenance record: compile afresh
             "fx_graph_cache": False, "autotune_local_cache": False}))
        # inductor resets its provenance record around a forward compile but not around the backward
        # one, compiled later at the first backward: a second recording in one process got the
        # kernels of every earlier backward graph too (36 kernels for 18), and lost its blocks
        from torch._inductor import debug as inductor_debug

        reset = getattr(inductor_debug, "reset_provenance_globals", None)
        if reset is not None:
            self._stack.enter_context(reset())
        trace_log.addHandler(self._handler)
        self._stack.callback(trace_log.removeHandler, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def graphs(self) -> list[dict[str, Any]]:
        """[{"kernels": [{"name", "extern", "blocks", "shares", "basis", "flops", "bytes"}, ...]}, ...],
        one per compiled graph."""
        return [{"kernels": graph_kernels(g, nodes=n)} for g, n in self._handler.graphs]
