"""lmprof train / infer step their workloads through the one session (pipeline/driven.py).

A step that fails inside the profiled window, or while the stopwatch pass runs, must end the session
before the error reaches the caller: the profiler stopped (torch's own flag is the truth), the hooks
gone, so the same process can profile again; the claimed folder, with nothing in it, is given back.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from lmprof.config import TrainConfig
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline import protocol
from lmprof.pipeline.train import measure_training, run_training
from lmprof.workloads.training import TrainWorkload


def _workload(fail_at: int | None) -> TrainWorkload:
    model = torch.nn.Linear(8, 8)
    calls = itertools.count(1)

    def loss_fn(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if next(calls) == fail_at:
            raise RuntimeError("the step failed")
        return m(x).square().mean()

    return TrainWorkload(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         batches=(torch.randn(4, 8) for _ in itertools.count()), device=resolve_device("cpu"),
                         loss_fn=loss_fn)


def _profiler_on() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


# warm-up 1 + the figures step + 2 clean + the profiler's warm-up step + 2 profiled = 7 calls of the step;
# 6 fails inside the profiled window, 8 in the stopwatch pass after it.
@pytest.mark.parametrize("fail_at", [6, 8])
def test_a_failing_step_stops_the_profiler_and_the_process_can_run_again(tmp_path, fail_at):
    cfg = TrainConfig(warmup=1, steps=2, profile_steps=2, device="cpu", energy="off", plots=False)
    folder = tmp_path / "r"
    folder.mkdir()
    with pytest.raises(RuntimeError, match="the step failed"), protocol.incomplete_until_saved(folder):
        measure_training(_workload(fail_at), cfg, folder, {})
    assert not _profiler_on()
    # Nothing was written yet (the trace is exported at the end), so the claimed folder is given back.
    assert not folder.exists()
    run = measure_training(_workload(None), cfg, tmp_path / "again", {})  # nothing left behind blocks a new run
    assert run.value("step_time") is not None and run.metrics["step_time"].n == 2


def test_train_counts_one_extra_untimed_warm_up_step_for_the_figures(tmp_path):
    """--warmup W --steps S --profile-steps P runs W + 1 (figures) + S + 1 (profiler warm-up) + P steps
    and a stopwatch pass; the figures step's memory is the steady state's (the optimizer's state exists)."""
    cfg = TrainConfig(preset="tiny", n_layer=1, batch_size=2, seq_len=16, warmup=1, steps=3, profile_steps=1,
                      device="cpu", energy="off", plots=False)
    run, _ = run_training(cfg, out_dir=tmp_path / "t")
    assert run.metrics["step_time"].n == 3
    # AdamW keeps two moments per parameter: the optimizer's bytes are 2 x the parameters' (+ step scalars).
    params, opt = run.value("memory.params"), run.value("memory.optimizer")
    assert opt is not None and params is not None and opt >= 2 * params
