"""Nsight Systems exports as lmprof traces: ``lmprof analyze report.sqlite`` (or ``report.nsys-rep``).

A reader of its own, beside the Kineto JSON reader: it fills the same table
(:class:`~lmprof.trace.load.TraceTable`), so every analysis runs unchanged. See
:mod:`lmprof.trace.nsys.build` for what each export table becomes, :mod:`lmprof.trace.nsys.names`
for the naming rules (NVTX, emit_nvtx, steps) and :mod:`lmprof.trace.nsys.rep` for ``.nsys-rep``.
This module only tells files and tables apart: the reader (and sqlite3) is imported when a file is
read, so a Kineto trace's analysis does not pay for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmprof.trace.load import TraceTable

__all__ = ["FORMAT", "is_nsys", "is_nsys_table", "load_nsys"]

FORMAT = "nsys-sqlite"  # TraceTable.meta["format"] of a table this reader made
SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: reports before Nsight Systems 2021.3


def looks_like_sqlite(path: Path) -> bool:
    """The file starts with SQLite's header (its suffix does not matter)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def is_report(path: Path) -> bool:
    """A file named like an Nsight Systems report (``.nsys-rep``, or ``.qdrep``)."""
    return path.name.lower().endswith(REPORT_SUFFIXES)


def is_nsys(path: Path) -> bool:
    """A file this reader takes: an SQLite file (by its header or its ``.sqlite`` name, so that a
    damaged one is told apart from a JSON trace) or an Nsight Systems report (by name)."""
    return is_report(path) or path.name.lower().endswith((".sqlite", ".sqlite3")) or looks_like_sqlite(path)


def is_nsys_table(table: TraceTable) -> bool:
    """A table loaded from an Nsight Systems export."""
    return table.meta.get("format") == FORMAT


def load_nsys(path: str | Path) -> list[TraceTable]:
    """The tables of an export, one per process (a ``.nsys-rep`` exported by ``nsys`` first)."""
    from lmprof.trace.nsys.build import load_export

    p = Path(path)
    if is_report(p) and not looks_like_sqlite(p):
        from lmprof.trace.nsys.rep import exported

        with exported(p) as sqlite:
            tables = load_export(sqlite)
        for t in tables:
            t.path = t.path.replace(str(sqlite), str(p))
        return tables
    return load_export(p)
