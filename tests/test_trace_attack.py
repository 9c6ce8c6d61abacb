"""Hostile traces (issue 14 §5): each crafted here, replayed through the CLI and the API.

A trace that cannot be read must give exit 2 and one line on stderr, never a traceback or a hang;
one that can mostly be read is analysed, with a note of what was skipped or repaired.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from lmprof.cli.main import main
from lmprof.errors import DataError
from lmprof.trace.fanout import analyze_path
from lmprof.trace.load import load_trace

SRC = Path(__file__).resolve().parents[1] / "src"


def _good() -> dict[str, Any]:
    return {
        "distributedInfo": {"rank": 0},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 50},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 10,
             "args": {"External id": 7, "Sequence number": 3}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 4,
             "args": {"correlation": 9}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 8, "dur": 20,
             "args": {"correlation": 9, "stream": 7, "device": 0}},
            {"ph": "s", "cat": "ac2g", "name": "f", "id": 9, "pid": 1, "tid": 1, "ts": 2},
        ],
    }  # fmt: skip


def _write(folder: Path, obj: Any = None, raw: bytes | None = None, name: str = "t.json") -> Path:
    path = folder / name
    path.write_bytes(raw if raw is not None else json.dumps(obj).encode())
    return path


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["analyze", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_clean_error(code: int, err: str, what: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmprof: error:"), err
    assert what in lines[0]
    assert "Traceback" not in err


# ------------------------------------------------------------------ mostly readable: analysed + note


def _mutated(tmp_path: Path, case: str) -> Path:
    t = _good()
    ev = t["traceEvents"]
    if case == "pid_2_64":
        ev[1]["pid"] = 2**64
        ev[2]["pid"] = 2**64
    elif case == "correlation_2_70":
        ev[2]["args"]["correlation"] = 2**70
    elif case == "seq_negative_2_70":
        ev[1]["args"]["Sequence number"] = -(2**70)
    elif case == "flow_id_2_64":
        ev[4]["id"] = 2**64
    elif case == "step_huge":
        ev[0]["name"] = "ProfilerStep#99999999999999999999999"
    elif case == "rank_10_30":
        t["distributedInfo"]["rank"] = 10**30
    elif case == "ts_huge":
        ev[1]["ts"] = 1e300
        ev[1]["dur"] = 1e300
    elif case == "nested_args":
        ev.append({"ph": "X", "cat": "cpu_op", "name": "deep", "ts": 3, "dur": 1, "args": {"x": "NEST"}})
    elif case == "bad_utf8":
        pass
    raw = json.dumps(t).encode()
    if case == "nested_args":
        raw = raw.replace(b'"NEST"', b"[" * 100_000 + b"]" * 100_000)
    if case == "bad_utf8":
        raw = raw.replace(b"aten::mm", b"aten\xff\xfe::mm")
    return _write(tmp_path, raw=raw)


MOSTLY = {
    "pid_2_64": None,  # out-of-range thread ids get a stable code like string ids: no note needed
    "correlation_2_70": "args.correlation that is not a 64-bit integer",
    "seq_negative_2_70": "args.seq that is not a 64-bit integer",
    "flow_id_2_64": None,  # coded like string ids, so start and finish still pair up
    "step_huge": None,
    "rank_10_30": "distributedInfo.rank is not a valid rank",
    "ts_huge": "timestamp or duration out of range",
    "nested_args": "could not be read and were skipped (first: nested too deeply)",
    "bad_utf8": "invalid UTF-8",
}


@pytest.mark.parametrize("case", sorted(MOSTLY))
def test_mostly_readable_traces_are_analysed_with_a_note(tmp_path, capsys, case):
    path = _mutated(tmp_path, case)
    note = MOSTLY[case]
    rep = analyze_path(path)
    notes = rep.traces[0].notes
    if note is None:
        assert notes == []
    else:
        assert any(note in n for n in notes), notes
    for extra in ([], ["--json"]):
        code, out, err = _cli(capsys, str(path), *extra)
        assert code == 0 and err == "" and "Traceback" not in out
        if extra:
            doc = json.loads(out)
            assert doc["traces"][0]["notes"] == notes
        elif note is not None:
            assert "note:" in out


def test_attack_values_land_where_they_should(tmp_path):
    t = load_trace(_mutated(tmp_path, "correlation_2_70"))
    rt = t.events[t.events["name"] == "cudaLaunchKernel"].iloc[0]
    assert rt["correlation"] == -1  # unusable id: absent, never a wrapped-around number
    t = load_trace(_mutated(tmp_path, "pid_2_64"))
    mm = t.events[t.events["name"] == "aten::mm"].iloc[0]
    launch = t.events[t.events["name"] == "cudaLaunchKernel"].iloc[0]
    assert mm["pid"] == launch["pid"] < 0 and t.meta["id_codes"][mm["pid"]] == str(2**64)
    t = load_trace(_mutated(tmp_path, "bad_utf8"))
    assert "aten\ufffd\ufffd::mm" in set(t.events["name"].astype(str))
    assert t.rank == 0
    t = load_trace(_mutated(tmp_path, "rank_10_30"))
    assert t.rank is None
    t = load_trace(_mutated(tmp_path, "ts_huge"))
    assert "aten::mm" not in set(t.events["name"].astype(str)) and len(t.events) == 3
    t = load_trace(_mutated(tmp_path, "step_huge"))
    from lmprof.trace.steps import step_stats

    assert step_stats(t) is None  # not a step number: not a step


def test_rank_10_30_json_output(tmp_path, capsys):
    code, out, err = _cli(capsys, str(_mutated(tmp_path, "rank_10_30")), "--json")
    assert code == 0 and json.loads(out)["traces"][0]["rank"] is None


def test_out_of_range_ints_in_json_never_crash():
    from lmprof.trace.analyze import _clean

    doc = _clean({"a": 10**30, "b": [2**63, -(2**70)], "c": 5})
    assert orjson.loads(orjson.dumps(doc)) == {"a": str(10**30), "b": [2**63, str(-(2**70))], "c": 5}


def test_one_bad_event_among_many_is_skipped(tmp_path):
    t = _good()
    t["traceEvents"] += [{"ph": "X", "name": f"op{i}", "ts": 100 + i, "dur": 1} for i in range(50)]
    t["traceEvents"][10]["name"] = {"an": "object"}
    t["traceEvents"][20]["ts"] = [1, 2]
    table = load_trace(_write(tmp_path, t))
    assert len(table.events) == 4 + 50 - 2
    assert any(n.startswith("2 of 55 trace events could not be read") for n in table.notes), table.notes


# ------------------------------------------------------------------- unreadable: exit 2, one line


def _deep_root(tmp_path: Path) -> Path:
    return _write(tmp_path, raw=b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}")


def _deep_meta(tmp_path: Path) -> Path:
    return _write(tmp_path, raw=b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "traceEvents": []}')


def _all_bad_utf8_names(tmp_path: Path) -> Path:
    events = [{"ph": "X", "name": {"bad": i}, "ts": i} for i in range(300)]
    return _write(tmp_path, {"traceEvents": events})


def _run_without_rank_numbers(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "rankX").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "rankX" / "trace.json.gz").write_bytes(gzip.compress(json.dumps(_good()).encode()))
    return run


def _mostly_garbage(tmp_path: Path) -> Path:
    t = _good()
    t["traceEvents"] += [{"ph": "X", "name": [i], "ts": i} for i in range(500)]
    return _write(tmp_path, t)


UNREADABLE = {
    "deep_root": (_deep_root, "no trace event could be read"),
    "deep_meta": (_deep_meta, "nested too deeply"),
    "all_events_bad": (_all_bad_utf8_names, "no trace event could be read"),
    "mostly_garbage": (_mostly_garbage, "too damaged to analyse"),
    "run_rankX": (_run_without_rank_numbers, "no rank<N>/trace.json.gz (found: rankX)"),
    "dev_null": (lambda _: Path(os.devnull), "is a device, not a trace file"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_unreadable_is_one_line_exit_2(tmp_path, capsys, case):
    make, what = UNREADABLE[case]
    path = make(tmp_path)
    with pytest.raises(DataError, match="."):
        analyze_path(path)
    for extra in ([], ["--json"]):
        code, _, err = _cli(capsys, str(path), *extra)
        _assert_clean_error(code, err, what)


def test_run_folder_with_odd_rank_folder_keeps_the_good_ranks(tmp_path, capsys):
    run = _run_without_rank_numbers(tmp_path)
    (run / "rank0").mkdir()
    (run / "rank0" / "trace.json.gz").write_bytes(gzip.compress(json.dumps(_good()).encode()))
    rep = analyze_path(run)
    assert [t.path for t in rep.traces] == [str(run / "rank0" / "trace.json.gz")]
    assert any("rankX" in n for n in rep.notes)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.timeout(60)
def test_fifo_is_refused_without_opening_it(tmp_path):
    # A FIFO with no writer blocks a plain open() forever: run the CLI in a child with a deadline.
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for target in (fifo, tmp_path):  # the FIFO itself, and a folder holding it
        proc = subprocess.run(
            [sys.executable, "-m", "lmprof", "analyze", str(target)],
            capture_output=True, text=True, timeout=45, env=env,
        )  # fmt: skip
        _assert_clean_error(proc.returncode, proc.stderr, "")
    assert "named pipe" in subprocess.run(
        [sys.executable, "-m", "lmprof", "analyze", str(fifo)], capture_output=True, text=True, timeout=45, env=env
    ).stderr
