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
def injected(block: str, work: Callable[[], None] | None, truth: Truth) -> Iterator[None]:
    """Run ``work`` inside every entry of ``block``; stopwatch every block while scopes are off."""

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
        t = time.perf_counter()
        with inner:
            if work is not None and name == block:
                with torch.no_grad():
                    work()
            yield
        if watching and truth.steps:
            truth.steps[-1][name] += time.perf_counter() - t

    with scope_hook(hook):
        yield
