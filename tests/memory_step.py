"""One step's memory measured the way a run measures it: through the figures step
(lmprof/pipeline/protocol/windows/figures.py) around a step the test runs itself.

The step runs as lmprof's own loop runs it (``phases=False``: the step's ``step_scope`` ranges name
its phases); the device is a torch device or its name (a fake CUDA backend is patched in by the test).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from lmprof.measure.memory import MeasuredMemory
from lmprof.pipeline.protocol.windows.figures import FiguresStep


def measure_step_memory(step: Callable[[], object], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                        device: Any = "cpu", *, mode: str = "train", warmup: int = 0,
                        out_dir: Path | None = None) -> MeasuredMemory:
    """Run ``warmup`` steps, then measure one (a CUDA step's allocator history goes to ``out_dir``)."""
    for _ in range(warmup):
        step()
    figures = FiguresStep(model, [optimizer] if optimizer is not None else [], torch.device(device), mode,
                          count_flops=False, compiled=False, phases=False, snapshot_dir=out_dir)
    figures.start()
    try:
        step()
    except BaseException:
        figures.abort()
        raise
    figures.stop()
    memory = figures.result().memory
    assert memory is not None, figures.memory_error
    return memory
