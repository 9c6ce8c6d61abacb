"""MLflow stores for the tracker tests: a sqlite database (MLflow's default store) made once per test
process and copied for each test, and MLflow's own readers.

Creating a sqlite store runs MLflow's schema migrations (5-8 s on a busy 2-core machine); a copy of an
already migrated, empty database opens in 0.06 s. ``tests/data/mlflow-empty.db.gz`` is one (17 KB),
made by ``python tests/mlflow_store.py`` with the locked MLflow; where the installed MLflow wants a
newer schema than it has, the template is made once per test process instead.
"""
from __future__ import annotations

import atexit
import functools
import gzip
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any


SHIPPED = Path(__file__).parent / "data" / "mlflow-empty.db.gz"


def _create(db: Path) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # creates the tables, migrated
    _default_artifacts(db, Path("mlruns") / "0")  # no trace of the folder it was made in


def _default_artifacts(db: Path, where: Path) -> None:
    """Point the Default experiment's artifacts (MLflow stores the path it had at creation) at ``where``."""
    con = sqlite3.connect(db)
    try:
        with con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (str(where),))
    finally:
        con.close()


@functools.lru_cache(maxsize=1)
def _template() -> Path:
    from mlflow.tracking import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="lmprof-mlflow-"))
    atexit.register(shutil.rmtree, folder, True)
    db = folder / "template.db"
    if SHIPPED.is_file():
        db.write_bytes(gzip.decompress(SHIPPED.read_bytes()))
        try:
            MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # MLflow checks the schema
            return db
        except Exception:  # noqa: BLE001 - another MLflow's schema: make one
            db.unlink()
    _create(db)
    return db


def fresh_db(folder: Path, name: str = "mlflow.db") -> str:
    """An empty, migrated MLflow sqlite store at ``folder/name``; its tracking URI."""
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / name
    shutil.copyfile(_template(), db)
    _default_artifacts(db, folder.resolve() / "mlruns" / "0")  # beside the database, never the working folder
    return f"sqlite:///{db}"


def search(uri: str, experiment: str) -> Any:
    """``mlflow.search_runs`` of ``experiment`` at ``uri`` (a DataFrame, one row per run)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment])
    finally:
        mlflow.set_tracking_uri(None)


def file_store(folder: Path) -> str:
    """A file store's URI (``file:``; MLflow 3 reads one only with MLFLOW_ALLOW_FILE_STORE=true)."""
    return folder.resolve().as_uri()


if __name__ == "__main__":  # rewrite the shipped template with the installed MLflow
    with tempfile.TemporaryDirectory() as d:
        made = Path(d) / "t.db"
        _create(made)
        SHIPPED.write_bytes(gzip.compress(made.read_bytes(), mtime=0))
    print(f"wrote {SHIPPED}", file=sys.stderr)
