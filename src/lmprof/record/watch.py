"""The whole-run watch on disk: run.json's ``watch`` section and the per-step series files.

After the measured window a watched run records one fixed-size row per step (:data:`SERIES_COLUMNS`)
and spills the rows in chunks, each chunk its own Parquet file written atomically
(``watch/series-00001.parquet``, ``-00002``, ...): a crash or a SIGTERM loses at most the rows not yet
spilled, never a finished chunk. The section (:class:`WatchSection`) lists the chunk files, the
baseline the detectors judged against, the alerts and the captured windows; it is also written on its
own as ``watch/watch.json`` whenever it changes, so a run that never reaches run.json keeps it.

Every figure carries its unit: seconds and bytes in the columns, :class:`~lmprof.record.run.Metric`
(value, unit, source) in an alert's evidence. docs/run-format.md documents all of it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

import numpy as np
import orjson
from pydantic import ValidationError

from lmprof.atomic import write_bytes
from lmprof.errors import DataError
from lmprof.record.run import (
    AlertKind, Baseline, Growth, RequestKind, Source, WatchAlert, WatchCapture, WatchSection,
)

__all__ = ["ALERT_KINDS", "COLUMN_NAMES", "SERIES_COLUMNS", "SERIES_SCHEMA", "WATCH_DIR", "AlertKind", "Baseline",
           "Column", "Growth", "RequestKind", "StepSummary", "WatchAlert", "WatchCapture", "WatchSection",
           "chunk_files", "load_section", "pyarrow_missing", "read_chunk", "read_series", "save_section"]

WATCH_DIR = "watch"
SECTION_NAME = "watch.json"
SERIES_SCHEMA = "lmprof.watch.series/1"
CHUNK_PATTERN = re.compile(r"^series-(\d{5,})\.parquet$")
# A chunk lmprof writes holds at most a few ten thousand rows; a file claiming more is not read
# (a record may come from anyone, and the report reads these files).
MAX_CHUNK_ROWS = 1 << 20

ALERT_KINDS: tuple[AlertKind, ...] = ("drift", "spike", "memory_creep", "input_bound", "straggler")


@dataclass(frozen=True)
class Column:
    """One column of the per-step series: its numpy dtype, unit and meaning."""

    name: str
    dtype: str
    unit: str
    source: Source
    meaning: str


# The per-step row. Floats are NaN where a figure is n/a for that step (the section's notes say why).
SERIES_COLUMNS: tuple[Column, ...] = (
    Column("step", "int64", "count", "measured", "the step's index, counted from the session's first step boundary"),
    Column("t_s", "float64", "s", "measured", "host clock at the step's end, seconds since the watch began"),
    Column("step_s", "float64", "s", "measured", "wall time of the step: host clock from one step boundary to the "
                                                 "next (no device sync)"),
    Column("device_s", "float64", "s", "measured", "device time between the CUDA events recorded at the step's two "
                                                   "boundaries, read back when done (NaN: no device clock)"),
    Column("input_wait_s", "float64", "s", "measured", "host clock from the end of the previous optimizer step to the "
                                                       "start of this step's first forward, lmprof's own time at "
                                                       "the boundary taken out (NaN: no forward seen)"),
    Column("input_stall_s", "float64", "s", "measured", "CUDA: device time between the previous step's boundary "
                                                        "event and this step's forward event, the time the device "
                                                        "sat idle waiting for input (NaN elsewhere)"),
    Column("tokens", "float64", "tokens", "measured", "tokens processed in the step (NaN: not known)"),
    Column("loss", "float64", "as reported", "measured", "the loss the script reported or returned (NaN: none)"),
    Column("mem_allocated_B", "float64", "B", "measured", "CUDA: bytes allocated by torch's caching allocator at "
                                                          "the step's end (NaN elsewhere or not sampled)"),
    Column("mem_reserved_B", "float64", "B", "measured", "CUDA: bytes reserved by the caching allocator (NaN "
                                                         "elsewhere or not sampled)"),
    Column("rss_B", "float64", "B", "measured", "the process's resident set size from /proc/self/statm (NaN where "
                                                "unreadable or not sampled)"),
    Column("own_s", "float64", "s", "measured", "time lmprof's watch itself spent inside this step (spilling a "
                                                "chunk, reading counters); the detectors take it out"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in SERIES_COLUMNS)
# What a summary shows as last read rather than the row's own: figures not taken every step.
LAST_READ = frozenset({"loss", "mem_allocated_B", "mem_reserved_B", "rss_B"})


@dataclass(frozen=True)
class StepSummary:
    """One watched step as the watch's lines and the trackers see it (NaN-free: None where n/a)."""

    step: int
    step_s: float
    device_s: float | None = None
    tokens_per_s: float | None = None
    loss: float | None = None
    input_wait_s: float | None = None
    mem_allocated_B: float | None = None
    mem_reserved_B: float | None = None
    rss_B: float | None = None

    @classmethod
    def from_row(cls, rows: dict[str, np.ndarray], i: int = -1) -> "StepSummary":
        """Row ``i`` of a block of series rows (:data:`COLUMN_NAMES` -> arrays); the memory and the loss as last
        read up to that row (the watch reads memory every few steps when a read is dear)."""

        def get(name: str) -> float | None:
            col = rows.get(name)
            if col is None or not len(col):
                return None
            if name in LAST_READ:
                seen = col[: i % len(col) + 1]
                seen = seen[np.isfinite(seen)]
                return float(seen[-1]) if len(seen) else None
            v = float(col[i])
            return v if math.isfinite(v) else None

        step_s = get("step_s") or 0.0
        tokens = get("tokens")
        return cls(step=int(rows["step"][i]), step_s=step_s, device_s=get("device_s"),
                   tokens_per_s=tokens / step_s if tokens is not None and step_s > 0 else None, loss=get("loss"),
                   input_wait_s=get("input_wait_s"), mem_allocated_B=get("mem_allocated_B"),
                   mem_reserved_B=get("mem_reserved_B"), rss_B=get("rss_B"))

    def items(self) -> list[tuple[str, float | None]]:
        """(field, value) pairs, in field order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


# -- files -------------------------------------------------------------------------------------------


def save_section(run_folder: str | Path, section: WatchSection) -> Path:
    """Write ``watch/watch.json`` (atomically): the section so far, for a run that ends before run.json."""
    path = Path(run_folder) / WATCH_DIR / SECTION_NAME
    return write_bytes(path, orjson.dumps(section.model_dump(mode="json"), option=orjson.OPT_INDENT_2))


def load_section(run_folder: str | Path) -> WatchSection:
    """Read ``watch/watch.json`` back (a :class:`DataError` naming the field when it is not one)."""
    path = Path(run_folder) / WATCH_DIR / SECTION_NAME
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError:
        raise DataError(f"{path} is not valid JSON") from None
    try:
        return WatchSection.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "record"
        raise DataError(f"{path}: field {where}: {' '.join(str(err.get('msg', '')).split())[:200]}") from None


def chunk_files(run_folder: str | Path) -> list[Path]:
    """The series chunks in ``watch/``, in step order (temporary files of an interrupted write skipped)."""
    folder = Path(run_folder) / WATCH_DIR
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return []
    found = sorted((int(m.group(1)), n) for n in names if (m := CHUNK_PATTERN.match(n)))
    return [folder / n for _, n in found]


def pyarrow_missing() -> str | None:
    """Why series files cannot be written or read here, None when pyarrow is installed."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return "the watch writes its per-step series as Parquet, which needs pyarrow: pip install 'lmprof[parquet]'"
    return None


def read_chunk(path: str | Path, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One series chunk as column arrays (float64, ``step`` int64); a :class:`DataError` for a file that is
    not one (not Parquet, more than :data:`MAX_CHUNK_ROWS` rows, a column missing or of another type)."""
    why = pyarrow_missing()
    if why is not None:
        raise DataError(why)
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = list(columns) if columns is not None else list(COLUMN_NAMES)
    try:
        pf = pq.ParquetFile(str(path))
        rows = pf.metadata.num_rows
        if rows > MAX_CHUNK_ROWS:
            raise DataError(f"{path}: {rows:,} rows, more than a watch chunk holds ({MAX_CHUNK_ROWS:,}): not read")
        missing = [c for c in wanted if c not in pf.schema_arrow.names]
        if missing:
            raise DataError(f"{path} is not a watch series chunk: no column {missing[0]!r}")
        table = pf.read(columns=wanted)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path} is not a readable Parquet file: {' '.join(str(exc).split())[:160]}") from None
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        col = table.column(name)
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise DataError(f"{path}: column {name!r} is {col.type}, not a number")
        arr = col.to_numpy(zero_copy_only=False)
        out[name] = arr.astype(np.int64) if name == "step" else arr.astype(np.float64)
    return out


def read_series(paths: Sequence[str | Path], columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Several chunks joined in order (callers bound how many; the report reads chunk by chunk)."""
    parts = [read_chunk(p, columns) for p in paths]
    names = list(columns) if columns is not None else list(COLUMN_NAMES)
    if not parts:
        return {n: np.empty(0, dtype=np.int64 if n == "step" else np.float64) for n in names}
    return {n: np.concatenate([p[n] for p in parts]) for n in names}
