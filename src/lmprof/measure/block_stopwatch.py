"""A clean pass with a device-synchronised stopwatch around each block: attribution's own check.

Profiled block times are reconstructed from a trace (per-event cost removed, scaled to the clean
step); a stopwatch around each block in a pass without the profiler is what they are judged against
(analysis/block_truth.py marks the blocks that miss their goal). The stopwatch wraps every
``scope(...)`` of the built-in GPT through :func:`lmprof.workloads.blocks.scope_hook` while scopes
are off, synchronising the device before and after each block, so a block's time includes the
device work it launched. Its time is exclusive of the blocks nested in it, as attribution counts.
Not for compiled models (the hook would be traced into the graph) nor for models whose blocks come
from module hooks (they emit no ``scope``): those get no stopwatch, and no block is marked.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from typing import Callable, Iterator

from lmprof.workloads.blocks import scope_hook, scopes_on

Key = tuple[str, str]  # (block, phase)


def block_stopwatch(step: Callable[[], object], steps: int, sync: Callable[[], None]) -> dict[Key, float]:
    """Run ``step`` ``steps`` times with a stopwatch around each block; median ms per step per (block, phase).

    Empty when no block scope ran (a model without ``scope`` statements).
    """
    per_step: list[dict[Key, float]] = []
    phase = ["step"]
    open_blocks: list[list[float]] = []  # [start, time of nested blocks], innermost last

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
        sync()
        open_blocks.append([time.perf_counter(), 0.0])
        try:
            with inner:
                yield
        finally:
            sync()
            start, nested = open_blocks.pop()
            took = time.perf_counter() - start
            per_step[-1][(name, phase[0])] += took - nested
            if open_blocks:
                open_blocks[-1][1] += took

    with scope_hook(hook):
        for _ in range(steps):
            per_step.append(defaultdict(float))
            step()
    keys = {k for s in per_step for k in s}
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) * 1e3 for k in keys}
