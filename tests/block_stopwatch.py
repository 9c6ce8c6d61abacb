"""A stopwatch around every block of the built-in GPT, during lmprof's own clean steps.

The independent truth for block attribution (tests/test_attribution_doubling.py and
benchmarks/attribution_truth.py): while lmprof runs its clean steps (scopes off, no profiler) each
``scope(...)`` of the built-in GPT is timed with perf_counter, in the same process and the same run
as lmprof's figures, so run-to-run drift of the machine cannot pass for attribution error. Optionally
known work is added inside one block. It is installed through lmprof.workloads.blocks.scope_hook.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch

from lmprof.workloads.blocks import scope_hook, scopes_on


class Truth:
    """Stopwatch per block, per step, during the steps lmprof runs with scopes off (clean steps)."""

    def __init__(self, first: str, phase: str | None = None) -> None:
        self.first, self.phase = first, phase  # a new step starts at each entry of ``first``
        self.current_phase = "forward"
        self.steps: list[dict[str, float]] = []
        self.work: list[float] = []

    def block_ms(self, skip: int) -> dict[str, float]:
        """Median ms per step of each block, after ``skip`` warm-up steps."""
        steps = self.steps[skip:]
        names = {k for s in steps for k in s}
        return {k: statistics.median(s.get(k, 0.0) for s in steps) * 1e3 for k in names}


@contextlib.contextmanager
def injected(block: str, work: Callable[[], None] | None, truth: Truth,
             sync: Callable[[], None] | None = None) -> Iterator[None]:
    """Run ``work`` inside every entry of ``block``; stopwatch every block while scopes are off.

    ``sync`` (e.g. the device's synchronize) runs before each reading of the stopwatch, so a block's
    time includes the device work it launched (no-op on the CPU, where ops are synchronous).
    """

    @contextlib.contextmanager
    def hook(kind: str, name: str, inner: contextlib.AbstractContextManager[object]) -> Iterator[None]:
        if kind == "step":  # a step part (prefill, decode, forward, ...): the phase the blocks run in
            before, truth.current_phase = truth.current_phase, name
            with inner:
                yield
            truth.current_phase = before
            return
        watching = not scopes_on() and (truth.phase is None or truth.current_phase == truth.phase)
        if watching and name == truth.first:
            truth.steps.append(defaultdict(float))
        if watching and sync is not None:
            sync()
        t = time.perf_counter()
        with inner:
            if work is not None and name == block:
                with torch.no_grad():
                    work()
            yield
            if watching and sync is not None:
                sync()
        if watching and truth.steps:
            truth.steps[-1][name] += time.perf_counter() - t

    with scope_hook(hook):
        yield


@contextlib.contextmanager
def module_stopwatch(truth: Truth, sync: Callable[[], None] | None = None) -> Iterator[None]:
    """A stopwatch around every block of a Hugging Face model, while scopes are off (clean steps).

    Blocks are the modules lmprof's hooks would scope (lmprof.workloads.hooks.block_names), found on
    the first forward of each top-level model; a new step starts at each top-level forward. Global
    module hooks (torch.nn.modules.module.register_module_forward_*hook), so nothing is patched.
    """
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    from lmprof.workloads.hooks import attention_core_name, block_names

    names: dict[int, str] = {}
    tops: set[int] = set()
    # Open blocks, innermost last: [module id, start, time of the blocks nested in it]. A block's time
    # is exclusive of the blocks inside it (a decoder layer holds its norms and projections), as
    # attribution counts it.
    open_blocks: list[list[float]] = []

    def now() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    def pre(module: torch.nn.Module, args: object) -> None:
        if scopes_on():
            return
        if id(module) not in names and id(module) not in tops and hasattr(module, "config") \
                and hasattr(module, "generate"):  # a top-level transformers causal LM, seen first
            tops.add(id(module))
            subs = dict(module.named_modules())
            names.update({id(subs[p]): n for p, n in block_names(module, attention_core_name(module)).items()})
        if id(module) in tops:
            truth.steps.append(defaultdict(float))
            open_blocks.clear()
        elif id(module) in names and truth.steps:
            open_blocks.append([float(id(module)), now(), 0.0])

    def post(module: torch.nn.Module, args: object, output: object) -> None:
        if scopes_on() or not open_blocks or open_blocks[-1][0] != float(id(module)):
            return
        _, start, inner = open_blocks.pop()
        took = now() - start
        truth.steps[-1][names[id(module)]] += took - inner
        if open_blocks:
            open_blocks[-1][2] += took

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
