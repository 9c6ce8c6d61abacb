"""The door to a trace: :func:`load_trace` reads a file into the :class:`TraceTable` every analysis
reads.

Traces are Kineto / Chrome JSON, read by :mod:`lmprof.trace.kineto` (its own package: the event
schema, the compiled reader, the msgspec rule, the splitter and the column merger); the table is
:mod:`lmprof.trace.table`'s. Callers import both from here, so a reader can move or another be added
without touching them.
"""
from __future__ import annotations

from lmprof.trace.kineto.load import decode_workers, load_trace
from lmprof.trace.read import open_regular
from lmprof.trace.table import MAX_RANK, TraceTable, parse_rank

__all__ = ["MAX_RANK", "TraceTable", "decode_workers", "load_trace", "open_regular", "parse_rank"]
