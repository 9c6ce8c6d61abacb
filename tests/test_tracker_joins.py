"""The callbacks' figures land in the tracker runs the user's framework opened, each read back with the
tracker's own reader (mlflow.search_runs, TensorBoard's EventAccumulator), no mocks:

- the HF Trainer with ``report_to=["mlflow", "tensorboard"]``: its MLflow callback ends its run before
  lmprof's callback logs, and transformers 5 names its TensorBoard folder on the callback, not in
  ``args.logging_dir``;
- Lightning with ``MLFlowLogger`` (a run outside ``mlflow.active_run()``, at its own tracking URI).

Truth: run.json as the callback wrote it (lmprof's measurement is not under test here).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmprof.record.run import Run
from lightning_fixtures import tiny_module
from mlflow_store import fresh_db, search

from lazy_imports import missing  # noqa: E402

pytestmark = [missing("tensorboard", "the tensorboard extra is not installed"),
              missing("mlflow", "the mlflow extra is not installed")]


def _scalars(logdir: Path) -> dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}


@pytest.fixture
def fresh_mlflow(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The process's MLflow state (tracking URI, active run) put back after the test."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.mark.slow  # imports the Trainer (transformers, accelerate): seconds where no earlier test did
def test_hf_trainer_report_to_mlflow_and_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     fresh_mlflow: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    import torch
    from transformers import Trainer, TrainingArguments

    from lmprof.integrations import TrainerCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}

    uri = fresh_db(tmp_path / "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the Trainer's MLflow callback reads it
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    data = [{"x": torch.randn(16), "labels": torch.randn(())} for _ in range(40)]
    cb = TrainerCallback(out=tmp_path / "runs", warmup=1, steps=2, profile_steps=1, report=False, verbose=False,
                         log_to=["mlflow", "tensorboard"])
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="no", report_to=["mlflow", "tensorboard"], use_cpu=True,
                             disable_tqdm=True, dataloader_num_workers=0, run_name="users-run")
    Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb]).train()
    assert "failed" not in capsys.readouterr().err
    run = Run.load(cb.folder)
    step_ms = run.metrics["step_time"].value
    # MLflow: the Trainer's own run holds lmprof's figures beside its loss; no second run.
    df = search(uri, "Default")
    assert len(df) == 1 and df.loc[0, "tags.mlflow.runName"] == "users-run"
    assert df.loc[0, "metrics.lmprof/step_time_ms"] == pytest.approx(step_ms)
    assert "metrics.loss" in df.columns and df.loc[0, "tags.lmprof.run_id"] == run.id
    block = run.blocks[0]
    assert df.loc[0, f"metrics.lmprof/blocks/{block.name}/{block.phase}_ms"] == pytest.approx(block.time_ms)
    # TensorBoard: the Trainer's log folder (output_dir/runs/<date>_<host>), not ./tensorboard.
    (logdir,) = (tmp_path / "out" / "runs").iterdir()
    scalars = _scalars(logdir)
    assert "train/loss" in scalars and scalars["lmprof/step_time_ms"] == pytest.approx(step_ms, rel=1e-6)
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "mlflow.db").exists()


def test_lightning_mlflow_logger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_mlflow: Any,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    pl = pytest.importorskip("pytorch_lightning", reason="the lightning extra is not installed")
    import torch

    from lmprof.integrations import LightningCallback

    monkeypatch.chdir(tmp_path)
    uri = fresh_db(tmp_path / "store")
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 16)), batch_size=4)
    cb = LightningCallback(out=tmp_path / "runs", warmup=1, steps=2, profile_steps=1, verbose=False, report=False,
                           log_to=["mlflow"])
    logger = pl.loggers.MLFlowLogger(experiment_name="mine", run_name="users-run", tracking_uri=uri)
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[cb], log_every_n_steps=1)
    trainer.fit(tiny_module(), loader)
    assert "failed" not in capsys.readouterr().err
    run = Run.load(cb.folder)
    df = search(uri, "mine")
    assert len(df) == 1 and df.loc[0, "run_id"] == logger.run_id  # the logger's run, no run of lmprof's own
    assert df.loc[0, "metrics.lmprof/step_time_ms"] == pytest.approx(run.metrics["step_time"].value)
    assert "metrics.train_loss" in df.columns
    assert not (tmp_path / "mlflow.db").exists()  # (./mlruns holds the logger's artifacts: its default)
