"""lmprof export --to mlflow, read back with mlflow.search_runs and MLflow's client (offline): into a
file store (a folder), a sqlite database URI given as it is, the store MLFLOW_TRACKING_URI names, a
server that cannot be reached; a second export updates the same MLflow run."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from export_fixtures import make_run, write_run, write_sweep
from lmprof.cli.main import main
from mlflow_store import file_store, fresh_db, search

from lazy_imports import missing  # noqa: E402

pytestmark = missing("mlflow", "the mlflow extra is not installed")


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow 3 refuses to *read* a file store without this too (the exporter sets it only while writing).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_metrics_params_tags_and_artifacts_equal_run_json(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run-a")
    store = tmp_path / "mlruns"
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", str(store)]) == 0
    df = search(file_store(store), "lmprof")
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
    # Each block's time a metric of its own, charted across runs: the fixture's 12.5 ms x 0.25 and x 0.75.
    assert row["metrics.blocks/attn.qkv/forward_ms"] == 3.125 and row["metrics.blocks/mlp.fc/backward_ms"] == 9.375

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=file_store(store))
    rid = row["run_id"]
    names = {a.path for a in client.list_artifacts(rid)} | {a.path for a in client.list_artifacts(rid, "lmprof")}
    assert {"blocks.json", "lmprof/report.html", "lmprof/trace.json.gz", "lmprof/run.json"} <= names
    assert {a.path for a in client.list_artifacts(rid, "plots")} == {"plots/roofline.png"}
    table = json.loads(Path(client.download_artifacts(rid, "blocks.json", str(tmp_path / "dl"))).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [(r["name"], r["phase"], r["time_ms"]) for r in rows] == [(b.name, b.phase, b.time_ms) for b in truth.blocks]


def test_sweep_is_one_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = write_sweep(tmp_path / "my-sweep")
    store = tmp_path / "mlruns"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    assert main(["export", str(sweep), "--to", "mlflow", "--dest", str(store)]) == 0
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while exporting
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    df = search(file_store(store), "my-sweep")
    got = dict(zip(df["tags.mlflow.runName"], df["metrics.step_time_ms"]))
    assert got == {"p0": 10.0, "p1": 20.0}


def test_sqlite_uri_is_used_as_given_and_a_second_export_updates_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = write_run(tmp_path / "run-a")
    uri = fresh_db(tmp_path / "db")
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", uri]) == 0
    first = capsys.readouterr().out
    assert uri in first and "(updated)" not in first
    assert not any(p.name.startswith("sqlite") for p in tmp_path.rglob("*"))  # no folder named after the URI
    df = search(uri, "lmprof")
    assert len(df) == 1 and df.loc[0, "metrics.step_time_ms"] == 12.5
    rid = df.loc[0, "run_id"]
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"] == {f"{uri} lmprof": rid}
    # Again: the same MLflow run, each metric still one point, the block table not appended to.
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", uri]) == 0
    assert "(updated)" in capsys.readouterr().out
    df = search(uri, "lmprof")
    assert list(df["run_id"]) == [rid]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert [m.value for m in client.get_metric_history(rid, "step_time_ms")] == [12.5]
    table = json.loads(Path(client.download_artifacts(rid, "blocks.json", str(tmp_path / "dl"))).read_text())
    assert len(table["data"]) == len(make_run().blocks)


def test_mlflow_tracking_uri_is_the_default_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmprof.record.run import Run
    from lmprof.trackers import export

    monkeypatch.chdir(tmp_path)
    uri = fresh_db(tmp_path / "env")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["export", str(write_run(tmp_path / "run-a")), "--to", "mlflow"]) == 0
    # The Python entry takes a URI as it is too (it once made a folder 'sqlite:/' of it).
    other = fresh_db(tmp_path / "api")
    where = export(Run.load(write_run(tmp_path / "run-b", "run-b", 20.0)), "mlflow", other)
    assert other in where
    assert list(search(uri, "lmprof")["tags.mlflow.runName"]) == ["run-a"]
    assert list(search(other, "lmprof")["metrics.step_time_ms"]) == [20.0]
    assert not (tmp_path / "mlflow.db").exists()  # MLflow's default store, not used when the variable is set


def test_destinations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from lmprof.trackers.to_mlflow import tracking_uri

    monkeypatch.chdir(tmp_path)
    for uri in ("sqlite:///x.db", "http://host:5000", "https://h/mlflow", "databricks", "databricks://profile",
                "file:///tmp/store", "postgresql+psycopg2://u@h/db"):
        assert tracking_uri(uri) == uri
    odd = "runs [v2]/$x"  # a folder, whatever it holds: a file store at its absolute path
    assert tracking_uri(odd) == (tmp_path / odd).as_uri()
    # No destination: MLflow's own choice (its default, sqlite:///mlflow.db here), nothing created by asking.
    assert tracking_uri(None) == mlflow.get_tracking_uri()
    assert tracking_uri(None).startswith("sqlite:") and not list(tmp_path.iterdir())


def test_unreachable_server_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = write_run(tmp_path / "run-a")
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot reach the MLflow server at http://127.0.0.1:{port}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-a"]  # no local folder in its place
    assert not (run_dir / "trackers.json").exists()
    # A sqlite file in a folder that does not exist: one line too, nothing made.
    assert main(["export", str(run_dir), "--to", "mlflow", "--dest", "sqlite:///no/such/x.db"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_log_to_an_unreachable_server_is_refused_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "runs"), "--log-to", "mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the MLflow server" in err
    assert not (tmp_path / "runs").exists()
