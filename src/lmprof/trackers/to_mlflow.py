"""MLflow: one MLflow run per lmprof run, in a file store (offline) or any tracking URI.

``dest`` is a folder (a ``file:`` store, MLflow's own offline format) or a tracking URI with a
scheme (``http://...``, ``sqlite:///...``). MLflow 3 keeps the file store in maintenance mode and
refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``; for a folder destination lmprof sets that for
the duration of the export only (and restores the caller's value). The experiment is ``group`` (a sweep's name) or
``project``; the MLflow run is named after the lmprof run id. Figures are metrics (unit in the
name), their unit, source and p10/p90 are tags (``unit.<name>``, ...), the config is params, the
block table is a logged table (``blocks.json``), plots go under ``plots/`` and the report, trace,
run.json and CSVs under ``lmprof/``.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmprof.record.run import Run
from lmprof.trackers.content import BLOCK_COLUMNS, artifacts, block_rows, figures, params, plots

# MLflow's limits: 250-character keys, 6000-character param values.
_KEY_MAX, _VALUE_MAX = 250, 6000


def tracking_uri(dest: Path) -> str:
    """A folder becomes a file store URI; a string with a scheme is used as it is."""
    text = str(dest)
    return text if "://" in text or text.startswith("file:") else dest.resolve().as_uri()


@contextlib.contextmanager
def allow_file_store(uri: str) -> Iterator[None]:
    """MLFLOW_ALLOW_FILE_STORE=true while a ``file:`` store is written; the caller's value restored after."""
    if not uri.startswith("file:"):
        yield
        return
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


def export_run(run: Run, dest: Path, *, project: str, group: str | None) -> str:
    """Log ``run`` to MLflow at ``dest``; returns ``experiment/run_id at uri``."""
    uri = tracking_uri(dest)
    with allow_file_store(uri):
        return _export(run, uri, project=project, group=group)


def _export(run: Run, uri: str, *, project: str, group: str | None) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = group or project
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
    tags = {"lmprof.run_id": run.id, "lmprof.mode": run.mode, "lmprof.noisy": str(run.noisy)}
    mlrun = client.create_run(exp_id, run_name=run.id, tags=tags)
    rid = mlrun.info.run_id
    _log(client, rid, run, prefix="")
    client.set_terminated(rid)
    return f"{name}/{rid} at {uri}"


def export_open_run(run: Run) -> str | None:
    """Log ``run`` into the MLflow run the caller has open (``mlflow.active_run()``), left open, every
    name under ``lmprof/`` (params ``lmprof.``) so none meets the caller's own; None when none is open."""
    import mlflow
    from mlflow.tracking import MlflowClient

    active = mlflow.active_run()
    if active is None:
        return None
    rid = active.info.run_id
    client = MlflowClient()
    client.set_tag(rid, "lmprof.run_id", run.id)
    _log(client, rid, run, prefix="lmprof/")
    return f"the open run {rid} at {mlflow.get_tracking_uri()}"


def _log(client: Any, rid: str, run: Run, *, prefix: str) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    figs = figures(run)
    metrics = [Metric(f"{prefix}{f.name}"[:_KEY_MAX], f.value, now, 0) for f in figs]
    run_tags = []
    for f in figs:
        name = f"{prefix}{f.name}"
        run_tags += [RunTag(f"unit.{name}"[:_KEY_MAX], f.unit), RunTag(f"source.{name}"[:_KEY_MAX], f.source)]
        if f.p10 is not None and f.p90 is not None:
            run_tags.append(RunTag(f"spread.{name}"[:_KEY_MAX], f"p10 {f.p10:g}, p90 {f.p90:g}, n {f.n}"))
    pprefix = "lmprof." if prefix else ""
    ps = [Param(f"{pprefix}{k}" if not k.startswith("lmprof.") else k, v[:_VALUE_MAX]) for k, v in params(run).items()]
    ps = [Param(p.key[:_KEY_MAX], p.value) for p in ps]
    # log_batch takes at most 1000 metrics, 100 params and 1000 entries in all per call.
    for i in range(0, max(len(metrics), len(ps), len(run_tags)), 100):
        client.log_batch(rid, metrics=metrics[i:i + 100], params=ps[i:i + 100], tags=run_tags[i:i + 100])
    if run.blocks:
        rows = block_rows(run)
        client.log_table(rid, data={c: [r[j] for r in rows] for j, c in enumerate(BLOCK_COLUMNS)},
                         artifact_file=f"{prefix}blocks.json")
    for png in plots(run):
        client.log_artifact(rid, str(png), artifact_path=f"{prefix}plots")
    for path in artifacts(run):
        client.log_artifact(rid, str(path), artifact_path="lmprof")
