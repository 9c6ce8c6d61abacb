"""The trace tables as numpy Frames and, on request, as pandas DataFrames: the same events either way.

The truth is the trace file itself, read with the json module: its complete ("ph": "X") events.
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from lmprof.trace.load import load_trace

TRACE = Path(__file__).parent / "data" / "traces" / "v100_train_rank0.json.gz"


def _x_events() -> list[dict]:
    with gzip.open(TRACE, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_frame_and_dataframe_hold_the_files_events() -> None:
    raw = _x_events()
    t = load_trace(TRACE)
    ev = t.event_cols
    assert len(ev) == len(raw)
    names = ev.labels("name")[ev["name"]]
    assert Counter(names.tolist()) == Counter(e["name"] for e in raw)
    assert np.array_equal(np.sort(ev["ts"]), np.sort([float(e["ts"]) for e in raw]))
    df = t.events
    assert isinstance(df, pd.DataFrame) and len(df) == len(raw)
    assert isinstance(df["name"].dtype, pd.CategoricalDtype) and isinstance(df["cat"].dtype, pd.CategoricalDtype)
    assert df["name"].astype(str).tolist() == names.tolist()
    for col in ("pid", "tid", "ts", "dur", "correlation", "external_id", "seq", "stream", "device"):
        assert np.array_equal(df[col].to_numpy(), ev[col]), col
    assert t.events is df  # built once
    assert len(t.flows) == len(t.flow_cols) and list(t.flows.columns) == t.flow_cols.columns


def test_replacing_the_dataframe_replaces_the_columns_and_the_cache() -> None:
    raw = _x_events()
    t = load_trace(TRACE)
    t.cache["stale"] = True
    keep = t.events["cat"].astype(str) != "kernel"
    t.events = t.events[keep]  # what lmprof.measure.window.drop_partial does
    assert len(t.event_cols) == sum(e.get("cat") != "kernel" for e in raw)
    assert "kernel" not in set(t.event_cols.labels("cat")[t.event_cols["cat"]].tolist())
    assert "stale" not in t.cache


def test_loading_a_trace_imports_no_pandas() -> None:
    code = f"from lmprof.trace.load import load_trace\nload_trace({str(TRACE)!r})\nimport sys\nprint('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_drop_partial_removes_only_the_unfinished_steps_without_pandas(tmp_path: Path) -> None:
    """A trace written event by event: ProfilerStep#1..#3 and an operator in each; dropping steps above
    2 leaves exactly the other events (the file's own list is the truth), and pandas is never needed."""
    events = []
    for i in (1, 2, 3):
        t0 = 100.0 * i
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 50.0})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 1, "dur": 10.0})
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#x", "pid": 1, "tid": 1, "ts": 500.0,
                   "dur": 1.0})  # not a number: never taken for a late step
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    code = ("import sys\nfrom lmprof.trace.load import load_trace\nfrom lmprof.measure.window import drop_partial\n"
            f"t = load_trace({str(path)!r})\ndrop_partial(t, 2)\nev = t.event_cols\n"
            "print(sorted(ev.labels('name')[ev['name']].tolist()))\nprint('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    kept = sorted(e["name"] for e in events if e["name"] != "ProfilerStep#3")
    assert out[-2] == str(kept)
    assert out[-1] == "False"
