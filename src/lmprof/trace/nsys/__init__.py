"""Nsight Systems exports as lmprof traces: ``lmprof analyze report.sqlite`` (or ``report.nsys-rep``).

A reader of its own, beside the Kineto JSON reader: it fills the same table
(:class:`~lmprof.trace.load.TraceTable`), so every analysis runs unchanged. See
:mod:`lmprof.trace.nsys.build` for what each export table becomes, :mod:`lmprof.trace.nsys.names`
for the naming rules (NVTX, emit_nvtx, steps) and :mod:`lmprof.trace.nsys.rep` for ``.nsys-rep``.
This module is the door; files.py tells files and tables apart: the reader (and sqlite3) is imported
when a file is read, so a Kineto trace's analysis does not pay for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lmprof.trace.nsys.files import FORMAT, is_nsys, is_nsys_table, is_report, looks_like_sqlite

if TYPE_CHECKING:
    from lmprof.trace.load import TraceTable

__all__ = ["FORMAT", "is_nsys", "is_nsys_table", "load_nsys"]


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
