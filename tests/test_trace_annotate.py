"""`lmprof analyze TRACE --annotate OUT`: the input's events byte for byte, plus lmprof's tracks."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.annotate import PID, TRACKS
from lmprof.trace.load import load_trace

DATA = Path(__file__).parent / "data" / "traces"


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _added(out: Path, src: Path) -> tuple[dict, dict, list[dict]]:
    got, want = _read(out), _read(src)
    n = len(want["traceEvents"])
    assert got["traceEvents"][:n] == want["traceEvents"]  # the input's events, unchanged and in order
    assert {k: v for k, v in got.items() if k != "traceEvents"} == {k: v for k, v in want.items() if k != "traceEvents"}
    return got, want, got["traceEvents"][n:]


def test_gpu_trace_gets_steps_idle_gaps_and_dead_windows(tmp_path, capsys):
    src = DATA / "gpu_2rank_rank0.json.gz"
    out = tmp_path / "annotated.json.gz"
    assert main(["analyze", str(src), "--annotate", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["traces"][0]
    _, want, added = _added(out, src)
    assert all(e["pid"] == PID for e in added)
    for e in added:  # what the Chrome trace format asks of each phase
        assert e["ph"] in ("M", "X", "i", "C")
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float | int) and e["tid"] in TRACKS.values()
    # steps: the trace's own ProfilerStep events, with the phase split of that step
    steps = [e for e in want["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    ours = [e for e in added if e["name"].startswith("step ")]
    assert [(e["ts"], e["dur"]) for e in ours] == [(s["ts"], s["dur"]) for s in steps]
    assert all(sum(e["args"]["phases_us"].values()) == pytest.approx(e["dur"], rel=1e-6) for e in ours)
    # device idle gaps add up to the report's idle time, by cause
    idle = report["device"]["idle"]
    for cause in ("sync", "host_bound", "other"):
        total = sum(e["dur"] for e in added if e["name"] == f"idle: {cause}")
        assert total == pytest.approx(idle[f"{cause}_us"], abs=1e-3)
    # dead windows: the longest per annotation name is the report's dead_max_us
    dead = {}
    for e in added:
        if e["name"].startswith("dead: "):
            dead[e["name"][6:]] = max(dead.get(e["name"][6:], 0.0), e["dur"])
    rows = {r["name"]: r["dead_max_us"] for r in report["annotations"]["rows"] if r["dead_max_us"] is not None}
    for name, longest in dead.items():
        if name in rows:
            assert longest == pytest.approx(rows[name], abs=1e-3)
    summary = [e for e in added if e["name"] == "lmprof analyze"]
    assert len(summary) == 1 and summary[0]["args"]["device"]["temporal"]["idle_us"] == pytest.approx(
        report["device"]["temporal"]["idle_us"], abs=1e-3)
    # and lmprof reads the copy: the input's events plus ours, nothing else
    t, t0 = load_trace(out), load_trace(src)
    assert (t.events["pid"] == PID).sum() == sum(e["ph"] == "X" for e in added)
    assert len(t.events) - len(t0.events) == sum(e["ph"] == "X" for e in added)


def test_memory_counters_and_a_plain_json_array(tmp_path):
    """A bare JSON-array trace (Chrome's other format) with allocator events: counters of allocated bytes."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11,
         "args": {"Bytes": 64, "Total Allocated": 64, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12,
         "args": {"Bytes": -64, "Total Allocated": 0, "Device Type": 0, "Device Id": -1}},
    ]
    src = tmp_path / "array.json"
    src.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    out = tmp_path / "out.json"
    assert main(["analyze", str(src), "--annotate", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got[:3] == events
    counters = [e for e in got[3:] if e["ph"] == "C"]
    assert [(e["ts"], e["args"]["bytes"]) for e in counters] == [(11, 64), (12, 0)]


def test_refuses_its_input_and_several_traces(tmp_path, capsys):
    src = tmp_path / "t.json.gz"
    shutil.copy(DATA / "cpu_only_tiny.json.gz", src)
    before = src.read_bytes()
    assert main(["analyze", str(src), "--annotate", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the input" in err
    assert src.read_bytes() == before
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", folder)
    assert main(["analyze", str(folder), "--annotate", str(tmp_path / "o.json")]) == 2
    assert "one trace" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_a_failed_write_leaves_nothing(tmp_path, capsys, monkeypatch):
    import lmprof.trace.annotate as annotate

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(annotate, "_copy", boom)
    out = tmp_path / "o.json"
    assert main(["analyze", str(DATA / "cpu_only_tiny.json.gz"), "--annotate", str(out)]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
