"""lmprof train / infer step their workloads through the one session (pipeline/protocol/own_loop.py).

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
from lmprof.pipeline.protocol import folder as protocol
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


class _FullDiskProfiler:
    """What kineto does on a full disk: writes ``<file>.tmp`` partly, leaves ``<file>`` empty, raises nothing."""

    def export_chrome_trace(self, path: str) -> None:
        from pathlib import Path

        Path(path + ".tmp").write_text('{"traceEvents": [')
        Path(path).write_text("")


def test_a_trace_export_that_writes_nothing_is_an_error_and_leaves_no_file(tmp_path):
    import errno

    from lmprof.measure.profiling import export_trace

    with pytest.raises(OSError) as info:
        export_trace(_FullDiskProfiler(), tmp_path / "trace.json")
    assert info.value.errno in (errno.ENOSPC, errno.EIO)
    assert list(tmp_path.iterdir()) == []  # neither the target nor kineto's partial file nor ours


def test_a_trace_that_cannot_be_written_leaves_the_clean_figures(tmp_path, monkeypatch):
    """The profiled window's trace is the big file: when it cannot be written, run.json (small) still is,
    with the clean timings and a note saying why there are no blocks."""
    import errno

    from lmprof.measure.window import ProfilerWindow

    def full(self: ProfilerWindow) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.raw_path))

    monkeypatch.setattr(ProfilerWindow, "export", full)
    cfg = TrainConfig(warmup=1, steps=2, profile_steps=1, device="cpu", energy="off", plots=False)
    run = measure_training(_workload(None), cfg, tmp_path / "r", {})
    assert run.metrics["step_time"].n == 2
    assert any("trace could not be written (disk full)" in n for n in run.notes), run.notes
