"""``--log-to`` on ``lmprof run`` and ``lmprof sweep``, and ``log_to=`` on the framework callbacks, read back
with each tracker's own reader, offline (TensorBoard's EventAccumulator, mlflow.search_runs, W&B's records).

Truth: run.json as written (for ``lmprof run`` and the callbacks, lmprof's own measurement is not under
test here: the question is whether the tracker holds exactly the record's numbers) and the fixture runs of
tests/export_fixtures.py for the sweep. Under ``lmprof run`` and the callbacks a tracker's failure is one
line on stderr and the user's exit code and stdout are untouched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from export_fixtures import write_run
from lmprof.cli.main import main
from lmprof.record.run import Run
from lightning_fixtures import tiny_module
from mlflow_store import file_store, fresh_db, search

from lazy_imports import Lazy, missing  # noqa: E402

pytestmark = [missing("tensorboard", "the tensorboard extra is not installed"),
              missing("mlflow", "the mlflow extra is not installed")]
mlflow = Lazy("mlflow")  # imported by the test that runs, not by every worker's collection

SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPT = """
import sys, torch
m = torch.nn.Linear(16, 16); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(8):
    m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
print("out:", sys.argv[1:])
sys.exit(5)
"""


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow 3 refuses to read a file store without it (lmprof sets it only while it writes one).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _scalars(logdir: Path) -> dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag)[0].value for tag in acc.Tags()["scalars"]}


def _lmprof_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lmprof", "run", "--steps", "3", "--warmup", "1", "--profile-steps",
                           "1", "--no-report", "--out", "runs", *args, str(script), "--lr", "3e-4"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_run_log_to_tensorboard_and_mlflow_equals_run_json(tmp_path: Path) -> None:
    uri = fresh_db(tmp_path / "store")  # where MLFLOW_TRACKING_URI points: --log-to mlflow goes there
    proc = _lmprof_run(tmp_path, "--log-to", "tensorboard", "--log-to", "mlflow", env={"MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 5, proc.stderr  # the script's own exit code
    assert proc.stdout == "out: ['--lr', '3e-4']\n"  # and its stdout, nothing of lmprof's or a tracker's
    (folder,) = (tmp_path / "runs").iterdir()
    run = Run.load(folder)
    step_ms = run.metrics["step_time"].value
    assert _scalars(tmp_path / "tensorboard" / run.id)["step_time_ms"] == pytest.approx(step_ms, rel=1e-6)
    df = search(uri, "lmprof")
    assert len(df) == 1 and df.loc[0, "tags.mlflow.runName"] == run.id
    assert df.loc[0, "metrics.step_time_ms"] == pytest.approx(step_ms)
    from lmprof.trackers.content import metric_name

    for key, m in run.metrics.items():  # every figure with a value, under its name with the unit
        if m.value is not None:
            assert df.loc[0, f"metrics.{metric_name(key, m.unit)}"] == pytest.approx(m.value), key
    assert "logged to tensorboard" in proc.stderr and "logged to mlflow" in proc.stderr


@pytest.mark.slow
def test_run_tracker_failure_is_one_line_and_keeps_the_exit_code(tmp_path: Path) -> None:
    (tmp_path / "tensorboard").write_text("a file where the log folder would go")
    proc = _lmprof_run(tmp_path, "--log-to", "tensorboard")
    assert proc.returncode == 5 and proc.stdout == "out: ['--lr', '3e-4']\n"
    lines = [ln for ln in proc.stderr.splitlines() if "logging to tensorboard failed" in ln]
    assert len(lines) == 1 and "the run folder" in lines[0] and "lmprof export" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert any((tmp_path / "runs").iterdir())  # the run folder is kept


def test_run_unknown_tracker_is_refused_before_the_script_runs(tmp_path: Path) -> None:
    proc = _lmprof_run(tmp_path, "--log-to", "comet")
    assert proc.returncode == 2 and "unknown tracker 'comet'" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "runs").exists()


class _FakeExecutor:
    """Stands in for the worker processes: each point's run folder is a fixture run, recorded ok."""

    def run(self, jobs: Any, timeout_s: float, python: str, on_start: Any) -> Any:
        from lmprof.sweep.runner import Outcome

        for i, (point, run_dir) in enumerate(jobs):
            on_start(point)
            write_run(run_dir, rid=point.id, step_ms=10.0 * (i + 1))
            yield point, Outcome("ok", None, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00", 1.0)


def test_sweep_log_to_is_one_tracker_run_per_point_in_one_group(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import lmprof.sweep.runner as runner

    monkeypatch.setattr(runner, "LocalExecutor", _FakeExecutor)
    monkeypatch.chdir(tmp_path)
    uri = fresh_db(tmp_path / "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: [1, 2]\ndevices: [cpu]\n")
    assert main(["sweep", str(spec), "--out", "my-sweep", "--log-to", "tensorboard", "--log-to", "mlflow"]) == 0
    points = sorted((tmp_path / "my-sweep" / "runs").glob("*/run.json"))
    assert len(points) == 2
    truth = {p.parent.name: Run.load(p.parent).metrics["step_time"].value for p in points}
    for pid, ms in truth.items():
        assert _scalars(tmp_path / "tensorboard" / "my-sweep" / pid)["step_time_ms"] == pytest.approx(ms)
    df = search(uri, "my-sweep")  # the group: one experiment named after the sweep
    got = dict(zip(df["tags.lmprof.run_id"], df["metrics.step_time_ms"]))
    assert got == pytest.approx(truth)
    # A resumed sweep runs nothing new, so it logs nothing again.
    assert main(["sweep", str(spec), "--out", "my-sweep", "--resume", "--log-to", "mlflow"]) == 0
    assert len(search(uri, "my-sweep")) == 2


def test_sweep_unknown_tracker_is_refused_before_any_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\ndevices: [cpu]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--log-to", "comet"]) == 2
    assert "unknown tracker 'comet'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.sqlite").exists()


def test_lightning_callback_logs_into_the_open_mlflow_run_and_tensorboard_logger(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pl = pytest.importorskip("pytorch_lightning", reason="the lightning extra is not installed")
    import torch

    from lmprof.integrations import LightningCallback

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16)), batch_size=4)
    cb = LightningCallback(out=tmp_path / "runs", warmup=1, steps=3, profile_steps=1, verbose=False, report=False,
                           log_to=["mlflow", "tensorboard"])
    logger = pl.loggers.TensorBoardLogger(str(tmp_path / "tb"), name="mine")
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[cb], log_every_n_steps=1)
    mlflow.set_tracking_uri((tmp_path / "mlruns").resolve().as_uri())
    try:
        with mlflow.start_run(run_name="users-own") as mine:
            mlflow.log_param("lr", 0.01)
            trainer.fit(tiny_module(), loader)
            active = mlflow.active_run()
            assert active is not None and active.info.run_id == mine.info.run_id  # left open for the user
    finally:
        mlflow.set_tracking_uri(None)
    assert "failed" not in capsys.readouterr().err
    run = Run.load(cb.folder)
    step_ms = run.metrics["step_time"].value
    df = search(file_store(tmp_path / "mlruns"), "Default")
    assert len(df) == 1 and df.loc[0, "tags.mlflow.runName"] == "users-own"  # no run of lmprof's own
    assert df.loc[0, "metrics.lmprof/step_time_ms"] == pytest.approx(step_ms)
    assert df.loc[0, "params.lr"] == "0.01" and df.loc[0, "tags.lmprof.run_id"] == run.id
    # TensorBoard: into the logger's own run folder, beside the user's train_loss.
    scalars = _scalars(Path(logger.log_dir))
    assert "train_loss" in scalars and scalars["lmprof/step_time_ms"] == pytest.approx(step_ms, rel=1e-6)


@pytest.mark.slow  # wandb starts its own service process: ~10-20 s on 2 busy cores
def test_callback_logging_into_the_open_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the callbacks call at the end of training, with the user's W&B run open (offline)."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from test_export_wandb import read_records

    from lmprof.trackers.export import log_quietly
    from lmprof.trackers.joins import Joins

    monkeypatch.setenv("WANDB_SILENT", "true")
    folder = write_run(tmp_path / "run-a", step_ms=12.5)
    wb = wandb.init(project="users", name="users-own", dir=str(tmp_path), mode="offline")
    try:
        wb.log({"train_loss": 1.0})
        (line,) = log_quietly(folder, ["wandb"], joins=Joins())
        assert wandb.run is wb and "the open run" in line
    finally:
        wb.finish()
    (wandb_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")  # the user's run, no second one
    for _ in range(600):
        records = read_records(wandb_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.1)
    history: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                history[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    assert history["train_loss"] == 1.0 and history["lmprof/step_time_ms"] == pytest.approx(12.5)
