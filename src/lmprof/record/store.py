"""The sweep results store: one SQLite file (``results.sqlite``, WAL mode) in the sweep folder.

Tables (the full schema is in docs/sweeps.md, so other tools can read it without lmprof):

* ``meta(key, value)`` — ``schema`` (:data:`SCHEMA`), the last ``spec`` (JSON), ``created``;
* ``points`` — one row per point: id, label, status, message, the product axes as columns, the point
  as JSON (``config``), its run folder, timestamps, duration;
* ``metrics(point_id, key, value, unit, source, p10, p90, n, note)`` — every metric of every ``ok``
  run, long format;
* ``blocks(point_id, name, phase, time_ms, profiled_ms, pct, calls, flops, bytes)`` — the per-block
  table of every ``ok`` run;
* view ``results`` — ``points`` with the common metrics pivoted into columns.

Each point's row is committed as soon as the point finishes, so an interrupted sweep loses at most the
point that was running. :func:`load_results` returns one row per point as a pandas DataFrame.
"""
from __future__ import annotations

import datetime as dt
import contextlib
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol

from lmprof import safejson
from lmprof.errors import DataError
from lmprof.safeyaml import short_repr
from lmprof.record.catalogue import metric_column as metric_column, ranked  # metric_column: re-exported

if TYPE_CHECKING:
    import pandas as pd

    from lmprof.record.run import Run

class PlannedPoint(Protocol):
    """What the store needs of a sweep point (sweep.spec.Point has it; the store sits below sweep).

    Read-only properties: the store only reads them, and a frozen Point (its id and label computed)
    offers nothing to write.
    """

    @property
    def id(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def seq_len(self) -> int: ...

    @property
    def device(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def compile(self) -> bool: ...

    @property
    def attention(self) -> str: ...

    @property
    def repeat(self) -> int: ...

    @property
    def model_spec(self) -> dict[str, Any]: ...

    def model_dump_json(self) -> str: ...


SCHEMA = "lmprof.sweep/1"
DB_NAME = "results.sqlite"
STATUSES = ("pending", "running", "ok", "oom", "timeout", "error")
FAILED = ("oom", "timeout", "error")
AXIS_COLUMNS = ("mode", "model", "batch_size", "seq_len", "device", "dtype", "compile", "attention", "repeat")

# Metrics pivoted by the SQL view `results`, in column order (load_results pivots all of them): the
# catalogue's view ranks. Column names come from the catalogue's metric_column.
VIEW_METRICS = tuple((m.name, m.unit) for m in ranked("view"))

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    id TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    status TEXT NOT NULL,
    message TEXT,
    mode TEXT NOT NULL,
    model TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    seq_len INTEGER NOT NULL,
    device TEXT NOT NULL,
    dtype TEXT NOT NULL,
    compile INTEGER NOT NULL,
    attention TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    n_layer INTEGER, n_head INTEGER, n_embd INTEGER,
    config TEXT NOT NULL,
    run_dir TEXT,
    device_resolved TEXT,
    device_name TEXT,
    started TEXT,
    finished TEXT,
    duration_s REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    point_id TEXT NOT NULL REFERENCES points(id),
    key TEXT NOT NULL, value REAL, unit TEXT NOT NULL, source TEXT NOT NULL,
    p10 REAL, p90 REAL, n INTEGER, note TEXT,
    PRIMARY KEY (point_id, key)
);
CREATE TABLE IF NOT EXISTS blocks (
    point_id TEXT NOT NULL REFERENCES points(id),
    name TEXT NOT NULL, phase TEXT NOT NULL,
    time_ms REAL, profiled_ms REAL, pct REAL, calls INTEGER, flops REAL, bytes REAL,
    PRIMARY KEY (point_id, phase, name)
);
"""


# Metric row holding run.json's ``noisy`` (1: the timed window was not steady; the note says why).
NOISY_KEY = "noisy"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def db_path(where: str | Path) -> Path:
    """``results.sqlite`` inside a sweep folder, or the path itself when it names a file."""
    p = Path(where)
    return p / DB_NAME if p.is_dir() or p.suffix != ".sqlite" else p


class Store:
    """Read/write access to one sweep's ``results.sqlite``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise DataError(f"{self.path} is {'a directory' if self.path.is_dir() else 'not a regular file'}, "
                            "not an lmprof sweep store: move it away or choose another --out")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: we open transactions ourselves, one per finished point.
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from None
        try:
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:  # someone else's database: never write our tables into it
                self.conn.close()
                raise DataError(f"{self.path} is an SQLite database but not an lmprof sweep store "
                                f"(tables: {', '.join(sorted(tables)[:5])}); choose another --out")
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(_DDL)
            self._create_view()
            with self.conn:
                self.conn.execute("BEGIN")
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA,))
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (_now(),))
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.Error as exc:
            self.conn.close()
            raise store_error(self.path, exc) from None
        if not row or not str(row[0]).startswith("lmprof.sweep/"):
            self.conn.close()
            raise DataError(f"{self.path} is not an lmprof sweep store (schema={str(row[0])[:40] if row else None!r})")

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction; an SQLite failure (disk full, read-only, locked) becomes one DataError line.
        The transaction is rolled back, so the store keeps every point recorded before."""
        try:
            with self.conn:
                self.conn.execute("BEGIN")
                yield
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create_view(self) -> None:
        cols = ",\n".join(
            f"  (SELECT value FROM metrics m WHERE m.point_id = p.id AND m.key = '{k}') AS {metric_column(k, u)}"
            for k, u in VIEW_METRICS
        )
        self.conn.execute(f"CREATE VIEW IF NOT EXISTS results AS SELECT p.*,\n{cols}\nFROM points p")

    # -- planning ------------------------------------------------------------------------------
    def count_points(self) -> int:
        """Points recorded so far (any status)."""
        return int(self.conn.execute("SELECT COUNT(*) FROM points").fetchone()[0])

    def statuses(self) -> dict[str, str]:
        """Point id -> status."""
        return dict(self.conn.execute("SELECT id, status FROM points").fetchall())

    def plan(self, points: Iterable[PlannedPoint], spec_json: str) -> None:
        """Record the planned points as ``pending`` (keeping any already recorded) and the spec.

        Pending rows of an earlier plan that the current spec no longer contains are dropped: they
        never ran, so nothing is lost.
        """
        points = list(points)
        wanted = {p.id for p in points}
        self._check_same_labels(points)
        with self._writing():
            # Pending rows the plan still has are kept, with their attempt counts (an interrupted point
            # is put back to pending and must not look as if it had never run).
            stale = [pid for (pid,) in self.conn.execute("SELECT id FROM points WHERE status = 'pending'")
                     if pid not in wanted]
            self.conn.executemany("DELETE FROM points WHERE id = ?", [(pid,) for pid in stale])
            base = int(self.conn.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM points").fetchone()[0])
            for i, p in enumerate(points):
                self.conn.execute("UPDATE points SET seq = ? WHERE id = ? AND status = 'pending'", (base + i, p.id))
                spec = p.model_spec
                self.conn.execute(
                    "INSERT OR IGNORE INTO points (id, label, status, mode, model, batch_size, seq_len, device, dtype,"
                    " compile, attention, repeat, n_layer, n_head, n_embd, config, seq)"
                    " VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (p.id, p.label, p.mode, p.model, p.batch_size, p.seq_len, p.device, p.dtype, int(p.compile),
                     p.attention, p.repeat, spec.get("n_layer"), spec.get("n_head"), spec.get("n_embd"),
                     p.model_dump_json(), base + i),
                )
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('spec', ?)", (spec_json,))

    def _check_same_labels(self, points: list[PlannedPoint]) -> None:
        """Refuse a plan in which a label now means another configuration than a point already run.

        A point's id is a hash of its whole resolved config, so a spec that changed (a model's n_embd)
        plans new points; under the old label they would read as repeats of the old configuration
        in ``results`` and plots. Nothing is deleted: the user renames the changed entry or picks
        another folder.
        """
        done: dict[str, tuple[str, str]] = {
            label: (pid, config) for pid, label, config in self.conn.execute(
                "SELECT id, label, config FROM points WHERE status != 'pending'")}
        for p in points:
            old = done.get(p.label)
            if old is None or old[0] == p.id:
                continue
            diff = _config_difference(old[1], p.model_dump_json())
            raise DataError(
                f"{self.path}: point '{p.label}' was run with another configuration ({diff}); give the changed "
                "model a new name in the spec, or use a new --out (the recorded runs are kept)")

    # -- recording -----------------------------------------------------------------------------
    def mark_running(self, point_id: str, run_dir: str, started: str) -> None:
        """The point has started: a row left ``running`` means the sweep died while it ran."""
        with self._writing():
            self.conn.execute(
                "UPDATE points SET status = 'running', message = NULL, run_dir = ?, started = ?, finished = NULL,"
                " duration_s = NULL, attempts = attempts + 1 WHERE id = ?",
                (run_dir, started, point_id),
            )
            self._clear_results(point_id)

    def mark_pending(self, point_id: str, message: str) -> None:
        """Put an interrupted point back in the queue."""
        with self._writing():
            self.conn.execute("UPDATE points SET status = 'pending', message = ? WHERE id = ?", (message, point_id))

    def finish(self, point_id: str, status: str, message: str | None, finished: str, duration_s: float,
               run: "Run | None" = None) -> None:
        """Record a finished point, with its run's metrics and blocks when it succeeded; one commit."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        with self._writing():
            self._clear_results(point_id)
            env = run.env if run is not None else None
            self.conn.execute(
                "UPDATE points SET status = ?, message = ?, finished = ?, duration_s = ?,"
                " device_resolved = ?, device_name = ? WHERE id = ?",
                (status, message, finished, duration_s, env.device if env else None,
                 env.device_name if env else None, point_id),
            )
            if run is not None:
                self.conn.executemany(
                    "INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(point_id, k, m.value, m.unit, m.source, m.p10, m.p90, m.n, m.note)
                     for k, m in run.metrics.items() if k != NOISY_KEY]
                    # the run's own verdict on its timing (run.json "noisy"), so plots can mark it
                    + [(point_id, NOISY_KEY, 1.0 if run.noisy else 0.0, "flag", "derived", None, None, None,
                        "; ".join(run.noise) or None)],
                )
                self.conn.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(point_id, b.name, b.phase, b.time_ms, b.profiled_ms, b.pct, b.calls, b.flops, b.bytes)
                     for b in run.blocks],
                )

    def _clear_results(self, point_id: str) -> None:
        self.conn.execute("DELETE FROM metrics WHERE point_id = ?", (point_id,))
        self.conn.execute("DELETE FROM blocks WHERE point_id = ?", (point_id,))


def _config_difference(old_json: str, new_json: str) -> str:
    """'model_spec.n_embd: 128 -> 256' for the first field that differs between two point configs."""
    def flat(obj: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                out.update(flat(v, f"{prefix}{k}."))
            return out
        return {prefix.rstrip("."): obj}

    try:
        old, new = flat(safejson.loads(old_json)), flat(safejson.loads(new_json))
    except (safejson.JSONError, TypeError):
        return "the recorded config is unreadable"
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            return f"{key}: {str(old.get(key))[:40]} -> {str(new.get(key))[:40]}"
    return "the config hash differs"


def store_error(path: Path, exc: Exception) -> DataError:
    """One line for an SQLite failure on a store (sqlite3.Error, or pandas' DatabaseError around one):
    read-only, locked, or not a store at all."""
    text = str(exc)
    low = text.lower()
    if "disk is full" in low or "disk quota" in low:
        return DataError(f"cannot write {path}: the disk is full ({text}); points recorded before are kept, "
                         "free some space and rerun with --resume")
    if "readonly" in low or "read-only" in low:
        return DataError(f"{path} is read-only: lmprof records each finished point there, so it needs write "
                         f"access to the file and its folder ({text})")
    if "locked" in low or "busy" in low:
        return DataError(f"{path} is locked by another process ({text}): is another sweep writing to it?")
    if "unable to open" in low:
        return DataError(f"cannot open {path} ({text}): check that its folder exists and is writable")
    return DataError(f"{path} is not an lmprof sweep store (a damaged or foreign file: {text}); "
                     "move it away, or choose another --out")


# -- reading -------------------------------------------------------------------------------------
def _connect_existing(path: str | Path) -> tuple[sqlite3.Connection, Path]:
    p = db_path(path)
    if p.exists() and not p.is_file():
        raise DataError(f"{p} is a directory, not an lmprof sweep store")
    if not p.is_file():
        raise DataError(f"no sweep results at {p} (run `lmprof sweep SPEC.yaml --out {Path(path)}` first)")
    try:
        conn = sqlite3.connect(p, timeout=30)
    except sqlite3.Error as exc:
        raise store_error(p, exc) from None
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise store_error(p, exc) from None
    if not row or not str(row[0]).startswith("lmprof.sweep/"):
        conn.close()
        raise DataError(f"{p} is not an lmprof sweep store (schema={row[0] if row else None!r})")
    return conn, p


# Columns read as numbers, by table. SQLite keeps whatever a writer put in a column (text stays text in
# a REAL column), and a store is a file anyone can edit: a value that is not a number is refused with
# the point and column named, before pandas turns the column into text and a plot fails on it.
_NUMBER_COLUMNS = {
    "points": ("batch_size", "seq_len", "compile", "repeat", "n_layer", "n_head", "n_embd", "duration_s",
               "attempts", "seq"),
    "metrics": ("value", "p10", "p90", "n"),
    "blocks": ("time_ms", "profiled_ms", "pct", "calls", "flops", "bytes"),
}


def _check_values(conn: sqlite3.Connection, path: Path) -> None:
    """One DataError line for the first value of a store that is not what lmprof wrote there: text
    in a number column, a point's config that is not a JSON object."""
    for table, cols in _NUMBER_COLUMNS.items():
        key = "id" if table == "points" else "point_id"
        odd = " OR ".join(f"typeof({c}) NOT IN ('integer', 'real', 'null')" for c in cols)
        row = conn.execute(f"SELECT {key}, {', '.join(cols)} FROM {table} WHERE {odd} LIMIT 1").fetchone()
        if row is not None:
            col, value = next((c, v) for c, v in zip(cols, row[1:]) if not isinstance(v, (int, float, type(None))))
            raise DataError(f"{path}: {table}.{col} of point {str(row[0])[:40]!r} holds {short_repr(value, 40)}, not a "
                            "number: the store was edited or damaged (move it away, or rerun the sweep)")
    for pid, config in conn.execute("SELECT id, config FROM points"):
        try:
            ok = isinstance(safejson.loads(config), dict)
        except (safejson.JSONError, TypeError):
            ok = False
        if not ok:
            raise DataError(f"{path}: points.config of point {str(pid)[:40]!r} is not a JSON object "
                            f"({short_repr(config, 40)}): the store was edited or damaged")


def load_results(path: str | Path) -> "pd.DataFrame":
    """One row per point of a sweep: status, flattened config, and one column per metric value.

    ``path`` is the sweep folder or its ``results.sqlite``. Metric columns are named by
    :func:`metric_column` (``step_time_ms``, ``tokens_per_s``, ``mfu_pct``, ...); their units are in
    ``df.attrs["units"]`` (column -> unit). ``run_dir`` is an absolute path; failed points have no
    metric values (NaN), never zeros. Rows are in plan order.
    """
    import pandas as pd

    conn, p = _connect_existing(path)
    try:
        _check_values(conn, p)
        points = pd.read_sql_query("SELECT * FROM points ORDER BY seq", conn)
        metrics = pd.read_sql_query("SELECT point_id, key, value, unit FROM metrics", conn)
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        raise store_error(p, exc) from None
    finally:
        conn.close()
    points["compile"] = points["compile"].astype(bool)
    points["run_dir"] = [str(p.parent / d) if isinstance(d, str) and d else None for d in points["run_dir"]]
    points = points.drop(columns=["seq"])
    units: dict[str, str] = {}
    if not metrics.empty:
        metrics["column"] = [metric_column(k, u) for k, u in zip(metrics["key"], metrics["unit"])]
        units = dict(zip(metrics["column"], metrics["unit"]))
        wide = metrics.pivot_table(index="point_id", columns="column", values="value", aggfunc="first", dropna=False)
        wide = wide.reindex(columns=sorted(units))
        clash = [c for c in wide.columns if c in points.columns]
        wide = wide.rename(columns={c: f"metric_{c}" for c in clash})
        units = {(f"metric_{c}" if c in clash else c): u for c, u in units.items()}
        points = points.merge(wide, left_on="id", right_index=True, how="left")
    points.attrs["units"] = units
    points.attrs["source"] = str(p)
    table: pd.DataFrame = points.reset_index(drop=True)  # pandas-stubs types this reset_index as Any
    return table


def load_blocks(path: str | Path) -> "pd.DataFrame":
    """The per-block rows of every ``ok`` run, joined with the point's axes (long format)."""
    import pandas as pd

    conn, p = _connect_existing(path)
    cols = ", ".join(f"p.{c}" for c in ("label", *AXIS_COLUMNS, "device_resolved", "device_name"))
    try:
        _check_values(conn, p)
        df = pd.read_sql_query(
            f"SELECT b.*, {cols} FROM blocks b JOIN points p ON p.id = b.point_id WHERE p.status = 'ok' ORDER BY p.seq",
            conn,
        )
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        raise store_error(p, exc) from None
    finally:
        conn.close()
    df["compile"] = df["compile"].astype(bool)
    return df


def load_metric_notes(path: str | Path, key_prefix: str) -> dict[str, int]:
    """Notes of n/a metrics whose key starts with ``key_prefix``, with how many runs gave each."""
    conn, _ = _connect_existing(path)
    try:
        rows = conn.execute(
            "SELECT note, COUNT(DISTINCT point_id) FROM metrics"
            " WHERE key LIKE ? ESCAPE '!' AND value IS NULL AND note IS NOT NULL GROUP BY note",
            (key_prefix.replace("!", "!!").replace("_", "!_").replace("%", "!%") + "%",),
        ).fetchall()
    except sqlite3.Error as exc:
        raise store_error(db_path(path), exc) from None
    finally:
        conn.close()
    return {str(n): int(c) for n, c in rows}
