"""A stopwatch around every block of the built-in GPT, during lmprof's own clean steps.

The independent truth for block attribution (tests/test_attribution_doubling.py and
benchmarks/attribution_truth.py): while lmprof runs its clean steps (scopes off, no profiler) each
``scope(...)`` of the built-in GPT is timed with perf_counter, in the same process and the same run
as lmprof's figures, so run-to-run drift of the machine cannot pass for attribution error. Optionally
known work is added inside one block.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch

import lmprof.workloads.blocks as blocks_module
import lmprof.workloads.gpt as gpt_module
import lmprof.workloads.inference as inference_module


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
    original_scope, original_step = gpt_module.scope, inference_module.step_scope

    @contextlib.contextmanager
    def step_scope(name: str) -> Iterator[None]:
        before, truth.current_phase = truth.current_phase, name
        with original_step(name):
            yield
        truth.current_phase = before

    @contextlib.contextmanager
    def scope(name: str) -> Iterator[None]:
        watching = not blocks_module._enabled and (truth.phase is None or truth.current_phase == truth.phase)
        if watching and name == truth.first:
            truth.steps.append(defaultdict(float))
        t = time.perf_counter()
        with original_scope(name):
            if work is not None and name == block:
                with torch.no_grad():
                    work()
            yield
        if watching and truth.steps:
            truth.steps[-1][name] += time.perf_counter() - t

    gpt_module.scope, inference_module.step_scope = scope, step_scope  # type: ignore[assignment]
    try:
        yield
    finally:
        gpt_module.scope, inference_module.step_scope = original_scope, original_step
