"""Load a Kineto / Chrome trace (JSON, plain or gzipped) into one columnar table.

Every analysis is a function of the :class:`TraceTable` this returns; nothing re-reads the file.

Columns of ``TraceTable.events`` (one row per complete ``"ph": "X"`` event, sorted by ``ts``):

============  =========  ========================================================================
column        dtype      meaning
============  =========  ========================================================================
name          category   event name (operator, kernel, annotation, runtime call)
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

``TraceTable.flows`` holds flow events (``ph`` s/t/f) with columns id, ph, cat, pid, tid, ts.
``TraceTable.meta`` keeps the top-level fields (distributedInfo, deviceProperties, ...).
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from lmprof.errors import DataError


class _Args(msgspec.Struct):
    correlation: int | str | None = None
    external_id: int | str | None = msgspec.field(default=None, name="External id")
    seq: int | str | None = msgspec.field(default=None, name="Sequence number")
    stream: int | str | None = None
    device: int | str | None = None


class _Event(msgspec.Struct):
    ph: str = ""
    name: str | int | float | None = ""
    cat: str | None = ""
    pid: int | str | None = 0
    tid: int | str | None = 0
    ts: float | str | None = 0.0
    dur: float | str | None = 0.0
    id: int | str | None = None
    args: _Args | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[Any] | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: int | str | None = None
    traceName: str | None = None


_TRACE_DECODER = msgspec.json.Decoder(_Trace)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])


@dataclass
class TraceTable:
    """A trace as columns. ``rank`` comes from distributedInfo when the trace has it."""

    events: pd.DataFrame
    flows: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    path: str = ""

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo") or {}
        rank = info.get("rank")
        return int(rank) if isinstance(rank, (int, float, str)) and str(rank).lstrip("-").isdigit() else None

    @property
    def has_gpu(self) -> bool:
        return bool(self.events["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).any())


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"trace not found: {path}") from None
    except OSError as exc:
        raise DataError(f"cannot read trace {path}: {exc.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{path}: gzip data is truncated or corrupt ({exc})") from None
    return raw


def _int_or_code(values: list[Any], codes: dict[str, int]) -> np.ndarray:
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, int):
            out[i] = v
        elif v is None:
            out[i] = -1
        else:
            s = str(v)
            if s.lstrip("-").isdigit():
                out[i] = int(s)
            else:
                # Non-numeric ids ("Spans", "stream 7 ..."): stable negative codes, names kept in meta.
                out[i] = codes.setdefault(s, -1000 - len(codes))
    return out


def _num(values: list[Any]) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray([float(v) if v not in (None, "") else 0.0 for v in values], dtype=np.float64)


def _opt_int(values: list[Any]) -> np.ndarray:
    out = np.full(len(values), -1, dtype=np.int64)
    for i, v in enumerate(values):
        if v is None:
            continue
        try:
            out[i] = int(v)
        except (TypeError, ValueError):
            pass
    return out


def load_trace(path: str | Path) -> TraceTable:
    """Parse a trace file into a :class:`TraceTable`, or raise DataError naming the problem."""
    p = Path(path)
    raw = _read_bytes(p)
    if not raw.strip():
        raise DataError(f"{p}: trace file is empty")
    try:
        if raw.lstrip()[:1] == b"[":
            trace = _Trace(traceEvents=_LIST_DECODER.decode(raw))
        else:
            trace = _TRACE_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise DataError(f"{p}: not a valid trace JSON ({exc})") from None
    return _to_table(trace, str(p))


def _to_table(trace: _Trace, path: str) -> TraceTable:
    xs = [e for e in trace.traceEvents if e.ph == "X"]
    fl = [e for e in trace.traceEvents if e.ph in ("s", "t", "f")]
    codes: dict[str, int] = {}
    no_args = _Args()
    args = [e.args or no_args for e in xs]
    events = pd.DataFrame(
        {
            "name": pd.Categorical([str(e.name) if e.name is not None else "" for e in xs]),
            "cat": pd.Categorical([(e.cat or "").lower() for e in xs]),
            "pid": _int_or_code([e.pid for e in xs], codes),
            "tid": _int_or_code([e.tid for e in xs], codes),
            "ts": _num([e.ts for e in xs]),
            "dur": _num([e.dur for e in xs]),
            "correlation": _opt_int([a.correlation for a in args]),
            "external_id": _opt_int([a.external_id for a in args]),
            "seq": _opt_int([a.seq for a in args]),
            "stream": _opt_int([a.stream for a in args]),
            "device": _opt_int([a.device for a in args]),
        }
    )
    events = events.sort_values("ts", kind="stable").reset_index(drop=True)
    flows = pd.DataFrame(
        {
            "id": _int_or_code([e.id for e in fl], codes),
            "ph": pd.Categorical([e.ph for e in fl]),
            "cat": pd.Categorical([(e.cat or "").lower() for e in fl]),
            "pid": _int_or_code([e.pid for e in fl], codes),
            "tid": _int_or_code([e.tid for e in fl], codes),
            "ts": _num([e.ts for e in fl]),
        }
    )
    meta: dict[str, Any] = {
        "distributedInfo": trace.distributedInfo,
        "deviceProperties": trace.deviceProperties,
        "baseTimeNanoseconds": trace.baseTimeNanoseconds,
        "schemaVersion": trace.schemaVersion,
        "traceName": trace.traceName,
        "id_codes": {v: k for k, v in codes.items()},
    }
    return TraceTable(events=events, flows=flows, meta=meta, path=path)
