"""SQL-ready tables of a trace: ``lmprof analyze TRACE --export DIR`` writes them as Parquet.

Seven files, one row group per trace (rank), columns documented in docs/trace-analysis.md:

* ``events.parquet``: every complete event, as loaded (:mod:`lmprof.trace.load`);
* ``kernels.parquet``: every device event (kernel, memcpy, memset) with its launch, operator,
  annotation, step and whether the device figures counted it;
* ``launches.parquet``: every runtime call that launched device work, with how many events;
* ``ops.parquet``: every CPU operator with its self time, parent and step;
* ``steps.parquet``: per ``ProfilerStep#N``: duration, operators and device work launched in it;
* ``collectives.parquet``: every collective of the device window (:mod:`lmprof.trace.comms`);
* ``critical_path.parquet``: per step, the critical path's microseconds by segment
  (:mod:`lmprof.trace.critical`).

Times are microseconds (``*_us``), rows refer to ``events.row`` of the same rank. Each file is
written beside its target and renamed into place when all traces are written (lmprof.atomic).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from lmprof.atomic import atomic_path
from lmprof.errors import ConfigError, DataError
from lmprof.outdir import check_output_dir
from lmprof.trace import kinds
from lmprof.trace.comms import Communication
from lmprof.trace.critical import SEGMENTS, CriticalPath
from lmprof.trace.intervals import union
from lmprof.trace.launches import graph_launched, kernel_launches
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import parents, self_time
from lmprof.trace.steps import profiler_steps, step_of

TABLES = ("events", "kernels", "launches", "ops", "steps", "collectives", "critical_path")


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401 - registers pa.parquet
    except ImportError:
        raise ConfigError("--export needs pyarrow: pip install 'lmprof[parquet]'") from None
    return pa


def check_export_dir(folder: Path) -> Path:
    """Refuse an export folder that cannot be one, before any trace is read."""
    _pa()
    check_output_dir(folder, "--export")  # the one rule for output folders (lmprof/outdir.py)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"--export {folder}: cannot create the folder ({exc.strerror})") from None
    return folder


def trace_tables(table: TraceTable, rank: int, window_rows: np.ndarray | None) -> dict[str, Any]:
    """The five tables of one trace as pyarrow Tables. ``window_rows``: device rows the figures counted."""
    pa = _pa()
    ev = table.events
    n = len(ev)
    ts, dur = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    names = _strings(pa, ev["name"])
    rank_col = lambda k: pa.array(np.full(k, rank, dtype=np.int32))  # noqa: E731

    events = pa.table(
        {
            "rank": rank_col(n),
            "row": pa.array(np.arange(n, dtype=np.int64)),
            "name": names,
            "cat": _strings(pa, ev["cat"]),
            **{c: pa.array(ev[c].to_numpy()) for c in ("pid", "tid")},
            "ts_us": pa.array(ts),
            "dur_us": pa.array(dur),
            **{c: pa.array(ev[c].to_numpy()) for c in ("correlation", "external_id", "seq", "stream", "device")},
        }
    )

    links = kernel_launches(table)
    dev = links.index.to_numpy()
    rt, op, ann = (links[c].to_numpy() for c in ("runtime", "op", "annotation"))
    graph = graph_launched(table, dev, rt)
    launch_ts = np.where(rt >= 0, ts[np.maximum(rt, 0)], np.nan)
    counted = np.isin(dev, window_rows) if window_rows is not None else np.zeros(len(dev), dtype=bool)
    kernels = pa.table(
        {
            "rank": rank_col(len(dev)),
            "row": pa.array(dev),
            "name": names.take(pa.array(dev)),
            "cat": _strings(pa, ev["cat"]).take(pa.array(dev)),
            "type": pa.array(np.asarray(kinds.KERNEL_TYPE_NAMES, dtype=object)[kinds.kernel_types(table, dev)]),
            "device": pa.array(ev["device"].to_numpy()[dev]),
            "stream": pa.array(ev["stream"].to_numpy()[dev]),
            "ts_us": pa.array(ts[dev]),
            "dur_us": pa.array(dur[dev]),
            "correlation": pa.array(ev["correlation"].to_numpy()[dev]),
            "launch_row": pa.array(rt),
            "launch_name": _take_or_null(pa, names, rt),
            "launch_delay_us": pa.array(links["launch_delay_us"].to_numpy(), from_pandas=True),
            "graph_launched": pa.array(graph),
            "op_row": pa.array(op),
            "op_name": _take_or_null(pa, names, op),
            "annotation_row": pa.array(ann),
            "annotation_name": _take_or_null(pa, names, ann),
            "step": pa.array(step_of(table, np.nan_to_num(launch_ts, nan=-np.inf))),
            "in_device_figures": pa.array(counted),
        }
    )

    linked = rt >= 0
    calls, per_call = np.unique(rt[linked], return_counts=True)
    call_graph = np.zeros(len(calls), dtype=bool)
    if calls.size:
        call_graph[np.searchsorted(calls, rt[linked][graph[linked]])] = True
    call_op = np.full(len(calls), -1, dtype=np.int64)
    if calls.size:
        call_op[np.searchsorted(calls, rt[linked])] = op[linked]
    launches = pa.table(
        {
            "rank": rank_col(len(calls)),
            "row": pa.array(calls),
            "name": names.take(pa.array(calls)),
            "tid": pa.array(ev["tid"].to_numpy()[calls]),
            "ts_us": pa.array(ts[calls]),
            "dur_us": pa.array(dur[calls]),
            "correlation": pa.array(ev["correlation"].to_numpy()[calls]),
            "device_events": pa.array(per_call.astype(np.int64)),
            "graph": pa.array(call_graph),
            "op_row": pa.array(call_op),
            "op_name": _take_or_null(pa, names, call_op),
            "step": pa.array(step_of(table, ts[calls])),
        }
    )

    op_rows = np.flatnonzero(kinds.op_mask(table))
    ops = pa.table(
        {
            "rank": rank_col(len(op_rows)),
            "row": pa.array(op_rows),
            "name": names.take(pa.array(op_rows)),
            "pid": pa.array(ev["pid"].to_numpy()[op_rows]),
            "tid": pa.array(ev["tid"].to_numpy()[op_rows]),
            "ts_us": pa.array(ts[op_rows]),
            "dur_us": pa.array(dur[op_rows]),
            "self_us": pa.array(self_time(table)[op_rows]),
            "parent_row": pa.array(parents(table)[op_rows]),
            "seq": pa.array(ev["seq"].to_numpy()[op_rows]),
            "step": pa.array(step_of(table, ts[op_rows])),
        }
    )
    return {"events": events, "kernels": kernels, "launches": launches, "ops": ops,
            "steps": _steps_table(pa, table, rank, kernels, ops)}  # fmt: skip


def _steps_table(pa: Any, table: TraceTable, rank: int, kernels: Any, ops: Any) -> Any:
    """Per step: duration, CPU operators in it, and the device work its runtime calls launched."""
    steps = profiler_steps(table)
    k_step = kernels.column("step").to_numpy()
    k_ts = kernels.column("ts_us").to_numpy()
    k_end = k_ts + np.maximum(kernels.column("dur_us").to_numpy(), 0.0)
    o_step = ops.column("step").to_numpy()
    rows: dict[str, list[Any]] = {c: [] for c in (
        "step", "ts_us", "dur_us", "ops", "device_events", "device_time_us", "device_busy_us",
        "device_start_us", "device_end_us",
    )}  # fmt: skip
    for s, ts, dur in zip(steps["step"], steps["ts"], steps["dur"]):
        mine = k_step == s
        s0, s1 = union(k_ts[mine], k_end[mine])
        rows["step"].append(int(s))
        rows["ts_us"].append(float(ts))
        rows["dur_us"].append(float(dur))
        rows["ops"].append(int((o_step == s).sum()))
        rows["device_events"].append(int(mine.sum()))
        rows["device_time_us"].append(float((k_end[mine] - k_ts[mine]).sum()))
        rows["device_busy_us"].append(float((s1 - s0).sum()))
        rows["device_start_us"].append(float(k_ts[mine].min()) if mine.any() else None)
        rows["device_end_us"].append(float(k_end[mine].max()) if mine.any() else None)
    schema = pa.schema(
        [("rank", pa.int32()), ("step", pa.int64()), ("ts_us", pa.float64()), ("dur_us", pa.float64()),
         ("ops", pa.int64()), ("device_events", pa.int64()), ("device_time_us", pa.float64()),
         ("device_busy_us", pa.float64()), ("device_start_us", pa.float64()), ("device_end_us", pa.float64())]
    )  # fmt: skip
    return pa.table({"rank": [rank] * len(rows["step"]), **rows}, schema=schema)


def _attribute_table(pa: Any, rank: int, items: list[Any], types: dict[str, Any]) -> Any:
    """An Arrow table: ``rank``, then one column per attribute of ``items`` (name -> Arrow type)."""
    cols = {"rank": pa.array([rank] * len(items), pa.int32())}
    cols.update({name: pa.array([getattr(i, name) for i in items], t) for name, t in types.items()})
    return pa.table(cols)


def analysis_tables(rank: int, comm: Communication | None, critical: CriticalPath | None) -> dict[str, Any]:
    """The collectives and the per-step critical path of one trace as Arrow tables (empty when absent)."""
    pa = _pa()
    calls = comm.calls if comm is not None else []
    coll = _attribute_table(pa, rank, calls, {
        "row": pa.int64(), "kind": pa.string(), "process_group": pa.string(), "seq": pa.int64(),
        "dtype": pa.string(), "group_size": pa.int64(), "message_bytes": pa.int64(), "start_us": pa.float64(),
        "time_us": pa.float64(), "algbw_gbps": pa.float64(), "busbw_gbps": pa.float64(),
    })  # fmt: skip
    steps = critical.steps if critical is not None else []
    path = _attribute_table(pa, rank, steps, {"step": pa.int64(), "step_us": pa.float64(), "kernels_on_path": pa.int64()})
    for seg in SEGMENTS:
        path = path.append_column(f"{seg}_us", pa.array([p.segments_us[seg] for p in steps], pa.float64()))
    return {"collectives": coll, "critical_path": path}


def _strings(pa: Any, col: Any) -> Any:
    """A pandas categorical as a pyarrow dictionary array (names are stored once)."""
    cat = col.cat
    codes = cat.codes.to_numpy().astype(np.int32)
    dictionary = pa.array([str(c) for c in cat.categories], type=pa.string())
    mask = codes < 0
    return pa.DictionaryArray.from_arrays(
        pa.array(np.maximum(codes, 0), mask=mask if mask.any() else None), dictionary
    )


def _take_or_null(pa: Any, names: Any, rows: np.ndarray) -> Any:
    rows = np.asarray(rows, dtype=np.int64)
    return names.take(pa.array(np.maximum(rows, 0), mask=rows < 0))


class Exporter:
    """Writes each trace's tables as one row group of the five Parquet files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = check_export_dir(Path(folder))
        self._stack = contextlib.ExitStack()
        self._writers: dict[str, Any] = {}
        self.rows = dict.fromkeys(TABLES, 0)

    def add(
        self,
        table: TraceTable,
        rank: int,
        window_rows: np.ndarray | None,
        comm: Communication | None = None,
        critical: CriticalPath | None = None,
    ) -> None:
        """Append one trace (``rank``: its rank, or its position when it has none) and, from its
        analysis, its collectives and critical path."""
        self.add_tables({**trace_tables(table, rank, window_rows), **analysis_tables(rank, comm, critical)})

    def add_tables(self, tables: dict[str, Any]) -> None:
        """Append one trace's tables, already made (by :func:`trace_tables` and :func:`analysis_tables`,
        in a worker process): one row group of each file."""
        pq = _pa().parquet
        for name, t in tables.items():
            writer = self._writers.get(name)
            if writer is None:
                tmp = self._stack.enter_context(atomic_path(self.folder / f"{name}.parquet"))
                writer = self._writers[name] = pq.ParquetWriter(str(tmp), t.schema)
            writer.write_table(t.cast(writer.schema))
            self.rows[name] += t.num_rows

    def close(self, ok: bool = True) -> None:
        """Finish the files (renamed into place only when ``ok``)."""
        for w in self._writers.values():
            w.close()
        if ok:
            self._stack.close()
        else:
            self._stack.__exit__(RuntimeError, RuntimeError("export abandoned"), None)
