"""MLflow: one MLflow run per lmprof run, at the tracking URI the user gave, else MLflow's own.

Where (:func:`tracking_uri`): ``dest`` as it is when it is a URI (``sqlite:///mlflow.db``,
``http(s)://host:port``, ``databricks``, ``file:...``, any ``scheme:``), a file store when it is a plain
folder; without ``dest``, MLflow's own choice: ``MLFLOW_TRACKING_URI``, ``mlflow.set_tracking_uri()``,
else its default (``sqlite:///mlflow.db`` in the working folder since MLflow 3.7, or ``./mlruns``
where that folder already holds runs). MLflow 3 keeps the file store in maintenance mode and refuses it
unless ``MLFLOW_ALLOW_FILE_STORE=true``: lmprof sets that only while it writes a ``file:`` store. A
server that cannot be reached, or a database store without its packages, is one line before anything
is written.

The experiment is ``group`` (a sweep's name) or ``project``; the MLflow run is named after the lmprof run
id, and its id is kept in the run folder (:mod:`~lmprof.trackers.ledger`): a second export of the folder
to the same URI and experiment updates that MLflow run. Figures are metrics (unit in the name), their
unit, source and p10/p90 are tags (``unit.<name>``, ...), each block's time a metric
``blocks/<block>/<phase>_ms``, the config params, the block table a logged table (``blocks.json``),
plots go under ``plots/`` and the report, trace, run.json and CSVs under ``lmprof/``.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lmprof.errors import ConfigError
from lmprof.record.run import Run
from lmprof.trackers import ledger
from lmprof.trackers.content import BLOCK_COLUMNS, artifacts, block_rows, block_scalars, figures, params, plots

# MLflow's limits: 250-character keys, 6000-character param values.
_KEY_MAX, _VALUE_MAX = 250, 6000
# Database stores MLflow opens through SQLAlchemy (a dialect may carry a driver: postgresql+psycopg2).
_DB_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql"}
_CONNECT_S = 5.0
# A server that answers but fails: MLflow retries 7 times with a growing back-off (minutes). Unless the
# user set their own, an export tries a little, then says what failed.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def is_uri(dest: str) -> bool:
    """Whether ``dest`` names a tracking URI (a scheme of two letters or more, or ``databricks``), not a folder."""
    if dest == "databricks":
        return True
    try:
        scheme = urlsplit(dest).scheme
    except ValueError:
        return False
    return len(scheme) > 1  # "C:\\runs" is a Windows folder, not a URI


def tracking_uri(dest: str | None) -> str:
    """Where an export goes: ``dest`` untouched when it is a URI, a ``file:`` store for a folder, MLflow's
    own tracking URI when there is no ``dest``."""
    if dest is None:
        import mlflow

        return str(mlflow.get_tracking_uri())
    if is_uri(dest):
        return dest
    return Path(dest).expanduser().resolve().as_uri()


def check_destination(uri: str) -> None:
    """Refuse, in one line and before anything is written, what cannot work: a server that does not
    answer, a database store without SQLAlchemy, a sqlite file in a folder that does not exist."""
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme in _DB_SCHEMES:
        if importlib.util.find_spec("sqlalchemy") is None or importlib.util.find_spec("alembic") is None:
            raise ConfigError(f"an MLflow database store ({uri}) needs SQLAlchemy and alembic: "
                              "pip install 'lmprof[mlflow]'")
        if scheme == "sqlite" and uri.startswith("sqlite:///"):
            path = Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0]))
            if str(path) not in ("", ":memory:") and not path.parent.is_dir():
                raise ConfigError(f"the folder of the MLflow database {uri} does not exist: {path.parent}")
    if scheme in ("http", "https"):
        _check_server(uri, parts.scheme)


def check_default() -> None:
    """:func:`check_destination` of the default destination (``--log-to mlflow``, before measuring)."""
    check_destination(tracking_uri(None))


def _check_server(uri: str, scheme: str) -> None:
    parts = urlsplit(uri)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"not a valid MLflow server address: {uri}") from None
    host = parts.hostname
    if not host:
        raise ConfigError(f"not a valid MLflow server address (no host): {uri}")
    if urllib.request.getproxies() and not urllib.request.proxy_bypass(host):
        return  # through a proxy: only the request itself can tell
    try:
        socket.create_connection((host, port), timeout=_CONNECT_S).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise ConfigError(f"cannot reach the MLflow server at {uri} ({why}): nothing was logged; is the server "
                          "running, and is --dest or MLFLOW_TRACKING_URI right?") from None


@contextlib.contextmanager
def scoped_env(uri: str) -> Iterator[None]:
    """While ``uri`` is written: MLFLOW_ALLOW_FILE_STORE=true for a ``file:`` store, short retries for a
    server where the user set none; the caller's environment restored after."""
    values: dict[str, str] = {}
    if uri.startswith("file:"):
        values["MLFLOW_ALLOW_FILE_STORE"] = "true"
    elif urlsplit(uri).scheme in ("http", "https"):
        values = {k: v for k, v in _HTTP_DEFAULTS.items() if k not in os.environ}
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def export_run(run: Run, dest: str | None, *, project: str, group: str | None) -> str:
    """Log ``run`` to MLflow at ``dest`` (see the module); returns ``experiment/run_id at uri``."""
    uri = tracking_uri(dest)
    check_destination(uri)
    with scoped_env(uri):
        return _export(run, uri, project=project, group=group)


def _live_run(client: Any, rid: str | None) -> Any:
    """The MLflow run ``rid`` when it still exists and is not deleted, else None."""
    if rid is None:
        return None
    try:
        found = client.get_run(rid)
    except Exception:  # noqa: BLE001 - gone, or another store: a new run is made
        return None
    return found if found.info.lifecycle_stage == "active" else None


def _export(run: Run, uri: str, *, project: str, group: str | None) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = group or project
    folder = Path(run.folder) if run.folder is not None else None
    where = f"{uri} {name}"
    before = _live_run(client, ledger.recall(folder, "mlflow", where)) if folder is not None else None
    if before is None:
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        tags = {"lmprof.run_id": run.id, "lmprof.mode": run.mode, "lmprof.noisy": str(run.noisy)}
        rid = client.create_run(exp_id, run_name=run.id, tags=tags).info.run_id
        if folder is not None:  # before logging: an export that fails half-way is finished in the same run
            ledger.remember(folder, "mlflow", where, rid)
    else:
        rid = before.info.run_id
    _log(client, rid, run, prefix="", before=before)
    client.set_terminated(rid)
    return f"{name}/{rid} at {uri}" + (" (updated)" if before is not None else "")


def export_open_run(run: Run) -> str | None:
    """Log ``run`` into the MLflow run the caller has open (``mlflow.active_run()``), left open; None
    when none is open."""
    import mlflow

    active = mlflow.active_run()
    if active is None:
        return None
    uri = str(mlflow.get_tracking_uri())
    return export_into_run(run, uri, active.info.run_id, open_run=True)


def export_into_run(run: Run, uri: str, rid: str, *, client: Any = None, open_run: bool = False) -> str:
    """Log ``run`` into the MLflow run ``rid`` at ``uri`` that the user's framework made (the HF
    Trainer's, Lightning's ``MLFlowLogger``'s), whether it is still open or already ended; every name
    under ``lmprof/`` (params ``lmprof.``) so none meets the framework's own. ``client``: the framework's
    own MlflowClient, where it has one."""
    with scoped_env(uri):
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
        client.set_tag(rid, "lmprof.run_id", run.id)
        _log(client, rid, run, prefix="lmprof/", before=_live_run(client, rid))
    return f"{'the open run' if open_run else 'the run'} {rid} at {uri}"


def _log(client: Any, rid: str, run: Run, *, prefix: str, before: Any) -> None:
    """Log everything of ``run`` into ``rid``; ``before`` (the MLflow run as it was) holds what an earlier
    export logged there already: the same params and metric values are not logged twice."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    had_metrics: dict[str, float] = dict(before.data.metrics) if before is not None else {}
    had_params: dict[str, str] = dict(before.data.params) if before is not None else {}
    figs = figures(run)
    values = [(f"{prefix}{f.name}", f.value) for f in figs]
    values += [(f"{prefix}{name}", value) for name, value in block_scalars(run)]
    metrics = [Metric(k[:_KEY_MAX], v, now, 0) for k, v in values if had_metrics.get(k[:_KEY_MAX]) != v]
    run_tags = []
    for f in figs:
        name = f"{prefix}{f.name}"
        run_tags += [RunTag(f"unit.{name}"[:_KEY_MAX], f.unit), RunTag(f"source.{name}"[:_KEY_MAX], f.source)]
        if f.p10 is not None and f.p90 is not None:
            run_tags.append(RunTag(f"spread.{name}"[:_KEY_MAX], f"p10 {f.p10:g}, p90 {f.p90:g}, n {f.n}"))
    pprefix = "lmprof." if prefix else ""
    ps = [Param((f"{pprefix}{k}" if not k.startswith("lmprof.") else k)[:_KEY_MAX], v[:_VALUE_MAX])
          for k, v in params(run).items()]
    # MLflow refuses a param logged again with another value: an earlier export's stand.
    ps = [p for p in ps if p.key not in had_params]
    # log_batch takes at most 1000 metrics, 100 params and 1000 entries in all per call.
    for i in range(0, max(len(metrics), len(ps), len(run_tags)), 100):
        client.log_batch(rid, metrics=metrics[i:i + 100], params=ps[i:i + 100], tags=run_tags[i:i + 100])
    table = f"{prefix}blocks.json"
    # log_table appends to a table logged before: an update keeps the one the first export wrote.
    if run.blocks and not (before is not None and _has_artifact(client, rid, table)):
        rows = block_rows(run)
        client.log_table(rid, data={c: [r[j] for r in rows] for j, c in enumerate(BLOCK_COLUMNS)},
                         artifact_file=table)
    for png in plots(run):
        client.log_artifact(rid, str(png), artifact_path=f"{prefix}plots")
    for path in artifacts(run):
        client.log_artifact(rid, str(path), artifact_path="lmprof")


def _has_artifact(client: Any, rid: str, path: str) -> bool:
    parent = path.rsplit("/", 1)[0] if "/" in path else None
    try:
        return any(a.path == path for a in client.list_artifacts(rid, parent))
    except Exception:  # noqa: BLE001 - an artifact store that cannot list: log the table again
        return False
