"""Open an Nsight Systems SQLite export read-only and read its tables as numpy columns.

The file is opened with SQLite's ``immutable`` flag (no lock, no journal, nothing written beside
it, so a read-only folder or a file another process is exporting cannot stall the read) and checked
before use: a regular file, SQLite's header, the tables and columns lmprof needs. SQLite stores any
value in any column, so every value is checked for its type in the query: a row whose times are
not integers is left out and counted, an optional id that is not an integer reads as -1. A file
that is damaged (truncated, overwritten) fails with SQLite's own reason as one :class:`DataError`
line. Rows are fetched in bounded batches straight into numpy.
"""
from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from lmprof.errors import DataError
from lmprof.trace.nsys.files import looks_like_sqlite
from lmprof.trace.nsys.schema import EVENT_TABLES, GPU_INFO, STRINGS, Source

_BATCH = 1 << 16  # rows per fetch: bounds the Python tuples alive at once


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Export:
    """An open export; every query error becomes one :class:`DataError` line naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            raise DataError(f"{path}: not a regular file")
        if not looks_like_sqlite(path):
            raise DataError(f"{path}: not an SQLite file (an Nsight Systems export is written by "
                            f"`nsys export --type sqlite`)")
        try:
            uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro&immutable=1"
            self.conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        except (sqlite3.Error, ValueError) as exc:
            raise DataError(f"{path}: cannot open as SQLite ({exc})") from None
        # names are UTF-8 text, but a damaged or hostile file may hold anything: never fail on it
        self.conn.text_factory = lambda b: b.decode("utf-8", "replace")
        rows = self._query("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        self.tables = {str(r[0]) for r in rows}

    def close(self) -> None:
        self.conn.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self._batches(sql, params, whole=True))

    def _batches(self, sql: str, params: tuple[Any, ...] = (), whole: bool = False) -> Iterator[Any]:
        try:
            cur = self.conn.execute(sql, params)
            while True:
                rows = cur.fetchmany(_BATCH)
                if not rows:
                    return
                if whole:
                    yield from rows
                else:
                    yield rows
        except sqlite3.Error as exc:
            raise DataError(f"{self.path}: cannot read the export ({exc})") from None

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        return {str(r[1]) for r in self._query(f"PRAGMA table_info({_quoted(table)})")}

    def check_is_export(self) -> None:
        """Refuse an SQLite file that is not an Nsight Systems export (no event table at all)."""
        if not any(t in self.tables for t in EVENT_TABLES):
            raise DataError(f"{self.path}: not an Nsight Systems export (none of the tables "
                            f"{', '.join(EVENT_TABLES)}; export a report with `nsys export --type sqlite`)")

    def count(self, table: str) -> int:
        return int(self._query(f"SELECT count(*) FROM {_quoted(table)}")[0][0])

    def read(self, src: Source, where: str = "", text: str | None = None) -> tuple[dict[str, np.ndarray], list[Any], int]:
        """The integer columns of ``src`` (-1 for an absent optional column or a non-integer value),
        the ``text`` column's values when asked for, and how many rows were left out because a
        required column did not hold an integer."""
        have = self.columns(src.table)
        missing = [c for c in src.required if c not in have]
        if missing:
            raise DataError(f"{self.path}: table {src.table} has no column {missing[0]} (not an Nsight Systems export?)")
        exprs = [_quoted(c) for c in src.required]
        exprs += [f"CASE WHEN typeof({_quoted(c)}) = 'integer' THEN {_quoted(c)} ELSE -1 END" if c in have else "-1"
                  for c in src.optional]
        ok = " AND ".join(f"typeof({_quoted(c)}) = 'integer'" for c in src.required)
        cond = f"{ok} AND ({where})" if where else ok
        text_expr = ""
        if text is not None:
            text_expr = (f", CASE WHEN typeof({_quoted(text)}) = 'text' THEN {_quoted(text)} END" if text in have
                         else ", NULL")
        sql = f"SELECT {', '.join(exprs)}{text_expr} FROM {_quoted(src.table)} WHERE {cond}"
        names = [*src.required, *src.optional]
        parts: list[np.ndarray] = []
        texts: list[Any] = []
        for rows in self._batches(sql):
            if text is not None:
                texts += [r[-1] for r in rows]
                rows = [r[:-1] for r in rows]
            parts.append(np.array(rows, dtype=np.int64).reshape(len(rows), len(names)))
        block = np.concatenate(parts) if parts else np.empty((0, len(names)), dtype=np.int64)
        cols = {n: np.ascontiguousarray(block[:, j]) for j, n in enumerate(names)}
        total_where = f" WHERE {where}" if where else ""
        skipped = self.count_where(src.table, total_where) - len(block)
        return cols, texts, skipped

    def count_where(self, table: str, where: str) -> int:
        return int(self._query(f"SELECT count(*) FROM {_quoted(table)}{where}")[0][0])

    def strings(self, wanted: set[int]) -> dict[int, str]:
        """The StringIds values of the ``wanted`` ids that the table holds."""
        if not wanted:
            return {}
        if STRINGS not in self.tables:
            return {}
        have = self.columns(STRINGS)
        if not {"id", "value"} <= have:
            return {}
        out: dict[int, str] = {}
        sql = f"SELECT id, value FROM {STRINGS} WHERE typeof(id) = 'integer'"
        for rows in self._batches(sql):
            for i, v in rows:
                if i in wanted:
                    out[int(i)] = v if isinstance(v, str) else str(v)
        return out

    def device_names(self) -> dict[int, str]:
        """Device id -> name from the export's GPU tables (empty when it has none)."""
        for table in GPU_INFO:
            if table not in self.tables:
                continue
            have = self.columns(table)
            key = "id" if "id" in have else "cudaId" if "cudaId" in have else None
            if key is None or "name" not in have:
                continue
            rows = self._query(f"SELECT {_quoted(key)}, name FROM {_quoted(table)} WHERE typeof({_quoted(key)}) = "
                               "'integer' AND typeof(name) = 'text'")
            return {int(i): str(n)[:200] for i, n in rows}
        return {}
