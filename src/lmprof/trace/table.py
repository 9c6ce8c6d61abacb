"""The trace as one columnar table: what every analysis reads, whatever file it was read from.

Every analysis is a function of a :class:`TraceTable`; nothing re-reads the file. The Kineto JSON
reader (:mod:`lmprof.trace.kineto`) builds one; :func:`lmprof.trace.load.load_trace` is the door.

Columns of ``TraceTable.event_cols`` (one row per complete ``"ph": "X"`` event, sorted by ``ts``),
a :class:`~lmprof.trace.frame.Frame` of numpy columns (``TraceTable.events``: the same as a pandas
DataFrame, with pandas categoricals for the category columns):

============  =========  ========================================================================
column        dtype      meaning
============  =========  ========================================================================
name          category   event name (operator, kernel, annotation, runtime call); in the Frame,
                         int32 codes into ``event_cols.labels("name")``
cat           category   Kineto category, lower-cased: cpu_op, user_annotation, kernel,
                         gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver, gpu_user_annotation,
                         python_function, ... ("" when absent)
pid, tid      int64      process / thread (GPU: device / stream); non-integer ids get stable codes
ts, dur       float64    start and duration, microseconds
correlation   int64      args.correlation (runtime call <-> kernel), -1 when absent
external_id   int64      args["External id"] (cpu op <-> runtime call), -1 when absent
seq           int64      args["Sequence number"] (forward op <-> backward node), -1 when absent
stream        int64      args.stream for device events, -1 when absent
device        int64      args.device for device events, -1 when absent
============  =========  ========================================================================

The names of the id columns (correlation to device) and of ``hw``'s columns below are
:mod:`lmprof.trace.fields`' (every reader fills them).

Each table below is a Frame (``TraceTable.*_cols``) and a DataFrame of the same name without ``_cols``.
``TraceTable.comms`` holds the collective parameters of the few events that carry them (column
``row`` into ``events``; collective, in_nelems, out_nelems, dtype, group_size, pg_name, coll_seq).
``TraceTable.hw`` holds what CUPTI reports per kernel and copy, for the events that have it (column
``row``; registers, shared_memory (bytes per block), blocks_per_sm, warps_per_sm, occupancy (est.
achieved occupancy %), nbytes (a copy's or set's size); NaN when absent or not a JSON number in [0, 1e30)).
``TraceTable.memory`` holds the allocator's ``[memory]`` instant events (``profile_memory=True``) in
file order: ts (float64 us), pid, tid, device_type (0 CPU, 1 CUDA, ...), device_id, bytes (negative
for a free), addr, ev_idx, total_allocated, total_reserved (int64, -1 when absent or odd; bytes 0).
``TraceTable.shapes`` holds the input shapes of the CPU operators that have them (``record_shapes``):
``row`` into ``events``, ``dims`` (per input: a tuple of sizes, a tuple of them for a tensor list, or
None) and ``types`` (dtype names), see :func:`lmprof.trace.kineto.decode.shape_fields`, and ``shape`` (int64,
one code per distinct (dims, types) pair).
``TraceTable.flows`` holds flow events (``ph`` s/t/f) with columns id, ph, cat, pid, tid, ts (none when
loaded with ``flows=False``).
``TraceTable.meta`` keeps the top-level fields (distributedInfo, deviceProperties, ...).

Timestamps are float64 microseconds: traces stamped in Unix-epoch microseconds (~1.7e15, older
Kineto) resolve 0.25 us in float64; newer ones (relative to baseTimeNanoseconds) resolve ~1 ns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from lmprof.trace.fields import COMM_COLUMNS, COMM_TEXT, HW_COLUMNS, MEMORY_COLUMNS
from lmprof.trace.frame import Frame, str_labels

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MAX_RANK", "TraceTable", "empty_comms", "empty_hw", "empty_memory", "empty_shapes", "parse_rank"]


def _none(dtype: type) -> np.ndarray:
    return np.empty(0, dtype=dtype)


def empty_comms() -> Frame:
    """A table of no collective parameters (the columns any reader fills; see the module docstring)."""
    return Frame({"row": _none(np.int64), **{f: str_labels([]) if f in COMM_TEXT else _none(np.int64)
                                             for f in COMM_COLUMNS}})


def empty_hw() -> Frame:
    """A table of no kernel resources or copy sizes."""
    return Frame({"row": _none(np.int64), **{f: _none(np.float64) for f in HW_COLUMNS}})


def empty_shapes() -> Frame:
    """A table of no operator input shapes."""
    return Frame({"row": _none(np.int64), "dims": _none(object), "types": _none(object), "shape": _none(np.int64)})


def empty_memory() -> Frame:
    """A table of no allocator events."""
    return Frame({"ts": _none(np.float64), "pid": _none(np.int64), "tid": _none(np.int64),
                  **{f: _none(np.int64) for f in MEMORY_COLUMNS}})


class _AsPandas:
    """A table of :class:`TraceTable` as a pandas DataFrame: its frame ``cols``, converted on first use."""

    def __init__(self, cols: str, what: str) -> None:
        self.cols, self.name = cols, ""
        self.__doc__ = f"{what} as a pandas DataFrame (see :attr:`{cols}`)."

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, table: None, owner: type) -> _AsPandas: ...

    @overload
    def __get__(self, table: TraceTable, owner: type) -> pd.DataFrame: ...

    def __get__(self, table: TraceTable | None, owner: type) -> _AsPandas | pd.DataFrame:
        if table is None:
            return self
        frame: Frame = getattr(table, self.cols)
        return table._frame(self.name, frame)


@dataclass
class TraceTable:
    """A trace as columns. ``rank`` comes from distributedInfo when the trace has it.

    The tables are :class:`~lmprof.trace.frame.Frame` s of numpy columns (``*_cols``); the analyses
    read those. ``events``, ``flows``, ``comms``, ``hw``, ``memory`` and ``shapes`` are the same
    tables as pandas DataFrames, built (and pandas imported) on first use, for the callers that want
    pandas. Treat them all as read-only: analyses cache arrays derived from them in ``cache``.
    """

    event_cols: Frame
    flow_cols: Frame
    meta: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # what the loader skipped or repaired, one sentence each (empty for a clean trace)
    notes: list[str] = field(default_factory=list)
    # collective parameters of the events that carry them (see the module docstring)
    comm_cols: Frame = field(default_factory=lambda: empty_comms())
    # kernel resources and copy sizes of the device events that carry them (see the module docstring)
    hw_cols: Frame = field(default_factory=lambda: empty_hw())
    # the allocator's "[memory]" instant events, in file order (see the module docstring)
    memory_cols: Frame = field(default_factory=lambda: empty_memory())
    # input shapes and dtypes of the operators that have them (record_shapes; see the module docstring)
    shape_cols: Frame = field(default_factory=lambda: empty_shapes())
    # the DataFrames already built from the frames above, by attribute name
    _pandas: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    def _frame(self, name: str, cols: Frame) -> pd.DataFrame:
        df = self._pandas.get(name)
        if df is None:
            df = self._pandas[name] = cols.to_pandas()
        return df

    @property
    def events(self) -> pd.DataFrame:
        """The events as a pandas DataFrame (see :attr:`event_cols`)."""
        return self._frame("events", self.event_cols)

    @events.setter
    def events(self, df: pd.DataFrame) -> None:
        # a caller that filters rows (lmprof.measure.window.drop_partial) replaces the events whole
        self.event_cols = Frame.from_pandas(df)
        self._pandas["events"] = df
        self.cache.clear()

    def names(self) -> np.ndarray:
        """Every event's name (an object array of str, one per row of :attr:`event_cols`), built once."""
        got = self.cache.get("names")
        if got is None:
            ev = self.event_cols
            got = self.cache["names"] = ev.labels("name")[ev["name"]]
        return got

    def durations(self) -> np.ndarray:
        """Every event's duration in microseconds, a negative one read as 0 (read-only), built once:
        five analyses each built this full-length array for themselves (and three the ends)."""
        got = self.cache.get("durations")
        if got is None:
            got = np.maximum(self.event_cols["dur"], 0.0)
            got.setflags(write=False)
            self.cache["durations"] = got
        return got

    def ends(self) -> np.ndarray:
        """Every event's end, ``ts`` plus :meth:`durations` (read-only), built once."""
        got = self.cache.get("ends")
        if got is None:
            got = self.event_cols["ts"] + self.durations()
            got.setflags(write=False)
            self.cache["ends"] = got
        return got

    def keep_events(self, keep: np.ndarray) -> None:
        """Keep only the events where the boolean mask ``keep`` is True (no pandas involved)."""
        self.event_cols = self.event_cols.take(keep)
        self._pandas.pop("events", None)
        self.cache.clear()

    flows = _AsPandas("flow_cols", "The flow events")
    comms = _AsPandas("comm_cols", "The collective parameters")
    hw = _AsPandas("hw_cols", "Kernel resources and copy sizes")
    memory = _AsPandas("memory_cols", "The allocator events")
    shapes = _AsPandas("shape_cols", "The operators' input shapes")

    @property
    def rank(self) -> int | None:
        """distributedInfo.rank when it is a plausible rank (0 <= rank < MAX_RANK), else None."""
        return parse_rank(self.meta.get("distributedInfo"))

    @property
    def has_gpu(self) -> bool:
        ev = self.event_cols
        labels = ev.labels("cat")
        hits = np.array([c in ("kernel", "gpu_memcpy", "gpu_memset") for c in labels] + [False], dtype=bool)
        return bool(hits[ev["cat"]].any())


MAX_RANK = 1 << 24  # no job has more ranks; anything larger is junk, not a rank


def parse_rank(info: Any) -> int | None:
    """The rank in a distributedInfo dict, or None when absent or not a plausible rank number."""
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, bool):
        return None
    if isinstance(rank, str) and rank.strip().isdigit() and len(rank.strip()) < 10:
        rank = int(rank.strip())
    if isinstance(rank, float) and rank.is_integer():
        rank = int(rank)
    return rank if isinstance(rank, int) and 0 <= rank < MAX_RANK else None
