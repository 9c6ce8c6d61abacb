"""The names of the trace table's columns that each reader fills from its own source: the ids that
link events and what the hardware reports per kernel and copy (their meaning: :mod:`lmprof.trace.table`).

The Kineto JSON reader (:mod:`lmprof.trace.kineto`, whose schema pairs each name with its args key)
and the Nsight Systems reader (:mod:`lmprof.trace.nsys`) both name them from here, so that neither
imports the other to agree on them.
"""
from __future__ import annotations

# int64 columns of the events, -1 when absent
ID_COLUMNS: tuple[str, ...] = ("correlation", "external_id", "seq", "stream", "device")
# float64 columns of TraceTable.hw_cols, NaN when absent
HW_COLUMNS: tuple[str, ...] = ("registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy", "nbytes")
