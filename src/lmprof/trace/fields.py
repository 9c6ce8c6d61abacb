"""The names of the trace table's columns that each reader fills from its own source: the ids that
link events, what the hardware reports per kernel and copy, the collectives' parameters and the
allocator's events (their meaning: :mod:`lmprof.trace.table`, which also builds them empty).

The Kineto JSON reader (:mod:`lmprof.trace.kineto`, whose schema pairs each name with its args key)
and the Nsight Systems reader (:mod:`lmprof.trace.nsys`) both name them from here, so that neither
imports the other to agree on them.
"""
from __future__ import annotations

# int64 columns of the events, -1 when absent
ID_COLUMNS: tuple[str, ...] = ("correlation", "external_id", "seq", "stream", "device")
# float64 columns of TraceTable.hw_cols, NaN when absent
HW_COLUMNS: tuple[str, ...] = ("registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy", "nbytes")
# columns of TraceTable.comm_cols after ``row``: text (COMM_TEXT, "" when absent) or int64 (-1 when absent)
COMM_COLUMNS: tuple[str, ...] = ("collective", "in_nelems", "out_nelems", "dtype", "group_size", "pg_name", "coll_seq")
COMM_TEXT: tuple[str, ...] = ("collective", "dtype", "pg_name")
# int64 columns of TraceTable.memory_cols after ts (float64), pid and tid: -1 when absent (bytes 0)
MEMORY_COLUMNS: tuple[str, ...] = ("device_type", "device_id", "bytes", "addr", "ev_idx", "total_allocated",
                                   "total_reserved")
