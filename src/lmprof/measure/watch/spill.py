"""Spilling the watch's rows to disk: each chunk its own Parquet file, written atomically.

Why one file per chunk rather than appending to one file: a Parquet file is only readable once its
footer is written, so an appended file killed mid-write loses everything in it. A chunk is written to
a temporary name and renamed (lmprof.atomic), so every ``series-NNNNN.parquet`` in the folder is
whole, whatever stops the process; the temporary file of an interrupted write is a dot-file that
readers skip (record/watch.py: ``chunk_files``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from lmprof.atomic import atomic_path
from lmprof.errors import ConfigError
from lmprof.record.watch import CHUNK_PATTERN, SERIES_COLUMNS, SERIES_SCHEMA, pyarrow_missing


class SeriesWriter:
    """Writes numbered chunks into one folder, never over a chunk that is already there."""

    def __init__(self, folder: str | Path):
        why = pyarrow_missing()
        if why is not None:
            raise ConfigError(why)
        import pyarrow as pa

        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            taken = [int(m.group(1)) for p in self.folder.iterdir() if (m := CHUNK_PATTERN.match(p.name))]
        except OSError as exc:
            raise ConfigError(f"cannot use {self.folder} for the watch's series: {exc.strerror or exc}") from None
        self._next = max(taken, default=0) + 1
        self.written: list[Path] = []
        types = {"int64": pa.int64(), "float64": pa.float64()}
        self._schema = pa.schema(
            [pa.field(c.name, types[c.dtype], nullable=False, metadata={"unit": c.unit, "source": c.source})
             for c in SERIES_COLUMNS],
            metadata={"schema": SERIES_SCHEMA})

    def write(self, columns: Mapping[str, np.ndarray]) -> Path:
        """Write one chunk (every column of :data:`SERIES_COLUMNS`, equal lengths) and return its path."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in self._schema],
                                     schema=self._schema)
        path = self.folder / f"series-{self._next:05d}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self._next += 1
        self.written.append(path)
        return path
