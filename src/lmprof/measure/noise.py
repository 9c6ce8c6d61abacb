"""How busy the machine was while lmprof measured: other processes' CPU use, load, threads.

A loaded machine gives confident nonsense (a 21 ms step measured as 230 ms, profiler overhead of
+44% then -4%), so every timed window is bracketed by a :class:`Snapshot` and the run says when
other work competed with it (``analysis/noise.py``). The counters and the one judgement of their
reading, at their own resolution (clock ticks), live in ``hardware/cpu_load.py``: calibration and
the quick bandwidth check, below this layer, judge their own measurements with them too.
"""
from __future__ import annotations

from lmprof.hardware.cpu_load import OTHER_CORES_LIMIT, OtherLoad, Snapshot, other_cores, other_load, snapshot

__all__ = ["OTHER_CORES_LIMIT", "OtherLoad", "Snapshot", "other_cores", "other_load", "snapshot"]
