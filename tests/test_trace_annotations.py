"""Annotations (record_function ranges) and CPU-only output of ``lmprof analyze``, on traces each
test records itself with torch.profiler; truths are read from the trace JSON event by event."""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lmprof.cli.main import main  # noqa: E402
from lmprof.trace.fanout import analyze_path  # noqa: E402

DATA = Path(__file__).parent / "data" / "traces"
SLEEP_S = 0.002


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """Three calls of outer > inner; outer sleeps before its first operator (a dead window)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("outer"):
                time.sleep(SLEEP_S)
                with record_function("inner"):
                    torch.mm(x, x).relu()
                torch.add(x, 1)
    out = tmp_path_factory.mktemp("ann") / "trace.json"
    prof.export_chrome_trace(str(out))
    return out


def _events(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_annotation_rows_equal_the_trace_event_durations(trace: Path) -> None:
    events = _events(trace)
    ann = [e for e in events if e["cat"] == "user_annotation"]
    truth: dict[str, list[float]] = defaultdict(list)
    for e in ann:
        truth[e["name"]].append(e["dur"])
    rows = {r.name: r for r in analyze_path(trace).traces[0].annotations.rows}
    assert set(rows) == {"outer", "inner"}
    assert rows["outer"].path == "outer" and rows["outer"].depth == 0
    assert rows["inner"].path == "outer > inner" and rows["inner"].depth == 1
    for name, durs in truth.items():
        assert rows[name].count == len(durs) == 3
        assert rows[name].total_us == pytest.approx(sum(durs), abs=1e-6)
        assert rows[name].device_us is None  # a CPU-only trace: no device column

    # self time: duration minus the events directly inside, found here by brute force
    def inside(a: dict, b: dict) -> bool:
        return (a is not b and a["tid"] == b["tid"] and a["ts"] <= b["ts"]
                and b["ts"] + b["dur"] <= a["ts"] + a["dur"] + 1e-3)  # fmt: skip

    host = [e for e in events if e["cat"] in ("cpu_op", "user_annotation")]
    for name in truth:
        want = 0.0
        for a in (e for e in ann if e["name"] == name):
            kids = [b for b in host if inside(a, b)]
            direct = [b for b in kids if not any(inside(c, b) for c in kids)]
            want += a["dur"] - sum(b["dur"] for b in direct)
        assert rows[name].self_us == pytest.approx(want, abs=1e-6)


def test_dead_window_is_start_to_first_operator(trace: Path) -> None:
    events = _events(trace)
    ops = sorted((e for e in events if e["cat"] == "cpu_op"), key=lambda e: e["ts"])
    dead = []
    for a in (e for e in events if e["name"] == "outer"):
        first = next(o for o in ops if o["ts"] >= a["ts"] and o["ts"] + o["dur"] <= a["ts"] + a["dur"])
        dead.append(first["ts"] - a["ts"])
    row = next(r for r in analyze_path(trace).traces[0].annotations.rows if r.name == "outer")
    assert row.dead_mean_us == pytest.approx(sum(dead) / len(dead), abs=1e-3)
    assert row.dead_max_us == pytest.approx(max(dead), abs=1e-3)
    assert row.dead_max_us >= SLEEP_S * 1e6  # the sleep is inside the dead window
    assert row.first_op == "aten::mm"


def test_cli_text_and_json(trace: Path, capsys) -> None:
    assert main(["analyze", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "rank ?" not in out  # a single-process trace has no rank header
    assert "Annotations" in out and "inner" in out
    assert max(len(line) for line in out.splitlines()) <= 80  # rich's width when not a terminal
    assert main(["analyze", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    assert {r["path"] for r in doc["annotations"]["rows"]} == {"outer", "outer > inner"}
    assert doc["memory"] is None  # not recorded with profile_memory


def test_cpu_only_trace_has_no_device_what_ifs(capsys) -> None:
    rep = analyze_path(DATA / "cpu_ops_only.json.gz").traces[0]
    assert rep.device is None and rep.critical_path is not None
    assert [w.change for w in rep.critical_path.what_if] == ["data loader off the critical path"]
    assert main(["analyze", str(DATA / "cpu_ops_only.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "launch overhead" not in out and "top kernel" not in out
    assert "rank 0," in out  # a trace that names its rank keeps it


def test_device_time_inside_annotations_on_a_gpu_trace() -> None:
    """Kernels launched inside an annotation count toward it and toward every annotation around it."""
    rep = analyze_path(DATA / "gpu_2rank_rank0.json.gz").traces[0]
    rows = rep.annotations.rows
    assert all(r.device_us is not None for r in rows)
    by_path = {r.path: r for r in rows}
    for r in rows:
        if r.depth:
            parent = by_path[r.path.rsplit(" > ", 1)[0]]
            assert r.device_us <= parent.device_us + 1e-6
    assert max(r.device_us for r in rows) > 0


def test_module_tree_from_with_modules(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(16, 4)))
    with profile(activities=[ProfilerActivity.CPU], with_modules=True, with_stack=True) as prof:
        for _ in range(2):
            m(torch.randn(2, 16))
    path = tmp_path / "mod.json"
    prof.export_chrome_trace(str(path))
    mods = [e for e in _events(path) if e["name"].startswith("nn.Module: ")]
    rows = {r.path: r for r in analyze_path(path).traces[0].modules.rows}
    assert set(rows) == {"Sequential_0", "Sequential_0 > Linear_0", "Sequential_0 > ReLU_0",
                         "Sequential_0 > Sequential_1", "Sequential_0 > Sequential_1 > Linear_1"}

    def inside(a: dict, b: dict) -> bool:
        return a is not b and a["ts"] <= b["ts"] and b["ts"] + b["dur"] <= a["ts"] + a["dur"] + 1e-3

    for p, r in rows.items():
        mine = [e for e in mods if e["name"] == "nn.Module: " + r.name]
        assert r.count == len(mine) == 2
        assert r.total_us == pytest.approx(sum(e["dur"] for e in mine), abs=1e-6)
        want = 0.0  # outside the direct child modules
        for a in mine:
            kids = [b for b in mods if inside(a, b)]
            want += a["dur"] - sum(b["dur"] for b in kids if not any(inside(c, b) for c in kids))
        assert r.self_us == pytest.approx(want, abs=1e-6)
