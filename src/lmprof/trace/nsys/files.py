"""Which files and tables are Nsight Systems exports: the SQLite header, the report names, the table's format.

Imported by the package's door (``__init__``) and by the reader (read.py, build.py) alike, so that
neither imports the other; sqlite3 is not needed to tell a file apart.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmprof.trace.table import TraceTable

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
