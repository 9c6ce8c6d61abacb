"""A clean pass with a device-synchronised stopwatch around each block: attribution's own check.

Profiled block times are reconstructed from a trace (per-event cost removed, scaled to the clean
step); a stopwatch around each block in a pass without the profiler is what they are judged against
(analysis/block_truth.py marks the blocks that miss their goal). The stopwatch wraps every
``scope(...)`` of the built-in GPT through :func:`lmprof.workloads.blocks.scope_hook` while scopes
are off, synchronising the device before and after each block, so a block's time includes the
device work it launched. Its time is exclusive of the blocks nested in it, as attribution counts.
A model whose blocks come from module hooks (a Hugging Face model: no ``scope`` statements) is timed
the same way by hooks on the modules lmprof's scopes would wrap (``workloads.hooks.block_names``),
which needs no forward-and-backward pairing: forward blocks only (prefill and decode for generation),
backward blocks stay unjudged. Not for compiled models (the hook would be traced into the graph).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from typing import Callable, Iterator

import torch

from lmprof.workloads.blocks import scope_hook, scopes_on

Key = tuple[str, str]  # (block, phase)


def block_stopwatch(step: Callable[[], object], steps: int, sync: Callable[[], None],
                    model: torch.nn.Module | None = None) -> dict[Key, float]:
    """Run ``step`` ``steps`` times with a stopwatch around each block; median ms per step per (block, phase).

    ``model``: time the blocks of a model scoped by module hooks (forward-direction blocks only).
    Empty when no block ran (a model without ``scope`` statements and no ``model`` given).
    """
    per_step: list[dict[Key, float]] = []
    phase = ["step"]
    open_blocks: list[list[float]] = []  # [start, time of nested blocks], innermost last

    def opened() -> None:
        sync()
        open_blocks.append([time.perf_counter(), 0.0])

    def closed(name: str) -> None:
        sync()
        start, nested = open_blocks.pop()
        took = time.perf_counter() - start
        per_step[-1][(name, phase[0])] += took - nested
        if open_blocks:
            open_blocks[-1][1] += took

    @contextlib.contextmanager
    def hook(kind: str, name: str, inner: contextlib.AbstractContextManager[object]) -> Iterator[None]:
        if scopes_on():  # only clean passes are timed
            with inner:
                yield
            return
        if kind == "step":  # a step part: the phase the blocks inside run in
            before, phase[0] = phase[0], name
            with inner:
                yield
            phase[0] = before
            return
        opened()
        try:
            with inner:
                yield
        finally:
            closed(name)

    with scope_hook(hook), _module_blocks(model, opened, closed):
        for _ in range(steps):
            per_step.append(defaultdict(float))
            step()
    keys = {k for s in per_step for k in s}
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) * 1e3 for k in keys}


@contextlib.contextmanager
def _module_blocks(model: torch.nn.Module | None, opened: Callable[[], None],
                   closed: Callable[[str], None]) -> Iterator[None]:
    """Forward hooks that open and close a stopwatch block around each module lmprof scopes."""
    if model is None:
        yield
        return
    from lmprof.workloads.hooks import attention_core_name, block_names

    modules = dict(model.named_modules())
    handles = []

    def pre(module: torch.nn.Module, args: object) -> None:
        if not scopes_on():
            opened()

    def post_for(name: str) -> Callable[[torch.nn.Module, object, object], None]:
        def post(module: torch.nn.Module, args: object, output: object) -> None:
            if not scopes_on():
                closed(name)
        return post

    try:
        for path, name in block_names(model, attention_core_name(model)).items():
            handles.append(modules[path].register_forward_pre_hook(pre))
            handles.append(modules[path].register_forward_hook(post_for(name), always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()
