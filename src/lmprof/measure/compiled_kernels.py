"""Which blocks each kernel of a compiled graph came from, from inductor's own provenance records.

With ``torch._inductor.config.trace.provenance_tracking_level`` on, inductor keeps, for every kernel it
generates (fused C++/Triton kernels and extern calls such as mm/addmm), the stack traces of the FX
nodes it contains (``torch._inductor.debug.create_kernel_information_json``). Each stack trace ends
in the model's source; for the built-in GPT a source line lies inside a ``with scope("<block>")``
statement of workloads/gpt.py, which names the block. A kernel whose nodes come from several blocks
fused them; its name maps to all of them, in the forward pass's block order.

The mapping is taken at compile time and written next to the trace as ``compiled_kernels.json``;
trace/compiled.py reads it to give compiled kernels' time to blocks.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch._inductor.config as inductor_config
from torch._logging._internal import trace_log

from lmprof import names
from lmprof.workloads import gpt as gpt_module

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
    """('cpp_fused_x_0', False) from 'cpp_fused_x_0:3'; ('mm', True) from 'extern_kernels.mm:2'."""
    base = re.sub(r":\d+$", "", name)
    extern = base.startswith("extern_kernels.")
    return base.removeprefix("extern_kernels."), extern


def _handle(name: str) -> int:
    m = re.search(r":(\d+)$", name)
    return int(m.group(1)) if m else 0


def graph_kernels(stacks: dict[str, list[str]], source: str | None = None) -> list[dict[str, Any]]:
    """One compiled graph's kernels in the order its code calls them, each with its blocks.

    ``stacks`` is inductor's kernel -> stack traces record for one graph; a kernel's ``:<handle>``
    suffix numbers kernels in code-generation order, which is the order the graph runs them.
    """
    source = source or inspect.getsourcefile(gpt_module) or ""
    out = []
    for name in sorted(stacks, key=_handle):
        base, extern = _base_name(name)
        blocks: list[str] = []
        for stack in stacks[name]:
            b = block_of_stack(stack, source)
            if b is not None and b not in blocks:
                blocks.append(b)
        order = {b: i for i, b in enumerate(names.FORWARD_BLOCKS)}
        blocks.sort(key=lambda b: order.get(b, len(order)))
        out.append({"name": base, "extern": extern, "blocks": blocks})
    return out


class _Artifacts(logging.Handler):
    """Keeps the payloads of inductor's per-graph 'kernel stack traces' structured-log artifact."""

    NAME = "inductor_provenance_tracking_kernel_stack_traces"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.graphs: list[dict[str, list[str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None) or {}
        art = meta.get("artifact") if isinstance(meta, dict) else None
        if isinstance(art, dict) and art.get("name") == self.NAME:
            with contextlib.suppress(ValueError, TypeError):
                self.graphs.append(json.loads(getattr(record, "payload", "") or "{}"))


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
        trace_log.addHandler(self._handler)
        self._stack.callback(trace_log.removeHandler, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def graphs(self) -> list[dict[str, Any]]:
        """[{"kernels": [{"name", "extern", "blocks"}, ...]}, ...], one per compiled graph."""
        return [{"kernels": graph_kernels(g)} for g in self._handler.graphs]
