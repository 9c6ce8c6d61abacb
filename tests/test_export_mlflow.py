"""lmprof export --to mlflow into a file store, read back with mlflow.search_runs and MLflow's client (offline)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from export_fixtures import make_run, write_run, write_sweep
from lmprof.cli.main import main

from lazy_imports import Lazy, missing  # noqa: E402

pytestmark = missing("mlflow", "the mlflow extra is not installed")
mlflow = Lazy("mlflow")  # imported by the test that runs, not by every worker's collection


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow 3 refuses to *read* a file store without this too (the exporter sets it only while writing).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _search(store: Path, experiment: str):
    mlflow.set_tracking_uri(store.resolve().as_uri())
    try:
        return mlflow.search_runs(experiment_names=[experiment])
    finally:
        mlflow.set_tracking_uri(None)


def test_metrics_params_tags_and_artifacts_equal_run_json(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run-a")
    store = tmp_path / "mlruns"
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", str(store)]) == 0
    df = _search(store, "lmprof")
    assert len(df) == 1
    row = df.iloc[0]
    truth = make_run()
    assert row["tags.mlflow.runName"] == "run-a"
    assert row["metrics.step_time_ms"] == truth.metrics["step_time"].value
    assert row["metrics.tokens_per_s"] == truth.metrics["tokens_per_s"].value
    assert row["metrics.mfu_pct"] == 12.25 and row["metrics.memory.peak_B"] == 123456789.0
    assert "metrics.energy.total_J" not in df.columns  # n/a: nothing to log
    assert row["tags.unit.step_time_ms"] == "ms" and row["tags.source.step_time_ms"] == "measured"
    assert row["tags.spread.step_time_ms"] == "p10 12.25, p90 12.875, n 10"
    assert row["params.model.n_layer"] == "2" and row["params.batch_size"] == "8"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    rid = row["run_id"]
    names = {a.path for a in client.list_artifacts(rid)} | {a.path for a in client.list_artifacts(rid, "lmprof")}
    assert {"blocks.json", "lmprof/report.html", "lmprof/trace.json.gz", "lmprof/run.json"} <= names
    assert {a.path for a in client.list_artifacts(rid, "plots")} == {"plots/roofline.png"}
    table = json.loads(Path(client.download_artifacts(rid, "blocks.json", str(tmp_path / "dl"))).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [(r["name"], r["phase"], r["time_ms"]) for r in rows] == [(b.name, b.phase, b.time_ms) for b in truth.blocks]


def test_sweep_is_one_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    sweep = write_sweep(tmp_path / "my-sweep")
    store = tmp_path / "mlruns"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    assert main(["export", str(sweep), "--to", "mlflow", "--dest", str(store)]) == 0
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while exporting
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    df = _search(store, "my-sweep")
    got = dict(zip(df["tags.mlflow.runName"], df["metrics.step_time_ms"]))
    assert got == {"p0": 10.0, "p1": 20.0}
