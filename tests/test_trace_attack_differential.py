"""The C trace reader against the msgspec reader: every trace under tests/data and a fixed corpus of
mutated traces give the same table, or both refuse (issue 29, "Also": the C reader parses untrusted
input). The corpus is seeded, so the suite always runs the same cases."""
from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest

from lmprof.errors import LmprofError
from lmprof.trace.kineto import scan as scan_mod
from lmprof.trace.load import load_trace

DATA = Path(__file__).parent / "data" / "traces"
pytestmark = pytest.mark.skipif(not scan_mod.NATIVE, reason="the C reader is not built")

BASE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10.5, "dur": 3, "pid": 7, "tid": 7,
     "args": {"External id": 1, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "c10::Half"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 11, "dur": 1, "pid": 7, "tid": 7,
     "args": {"Input Dims": [[[2, 3], [2, 3]], [], [5]], "Input type": ["TensorList", "Scalar", "long int"]}},
    {"ph": "X", "cat": "kernel", "name": "sgemm \\u00e9 {lambda}, x", "ts": 12, "dur": 1.25, "pid": 0, "tid": 7,
     "args": {"correlation": 5, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 40, "pid": 7, "tid": 7},
    {"ph": "f", "id": 5, "pid": 0, "tid": 7, "ts": 12, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "i", "s": "t", "name": "[memory]", "pid": 7, "tid": 7, "ts": 11, "args": {"Bytes": 64}},
]}


def _table(path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(scan_mod, "NATIVE", native)
    try:
        t = load_trace(path, workers=1)
    except LmprofError:
        return "refused"
    return t


def _same(a: object, b: object) -> None:
    import pandas as pd

    if isinstance(a, str) or isinstance(b, str):
        assert a == b, (a if isinstance(a, str) else "read", b if isinstance(b, str) else "read")
        return
    for frame in ("events", "flows", "comms", "hw", "memory", "shapes"):
        pd.testing.assert_frame_equal(getattr(a, frame), getattr(b, frame), obj=frame)
    assert a.meta == b.meta  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json*")), ids=lambda p: p.name)
def test_every_stored_trace_gives_the_same_table(path, monkeypatch):
    _same(_table(path, True, monkeypatch), _table(path, False, monkeypatch))


@functools.lru_cache(maxsize=1)
def _mutants(n: int = 120) -> list[bytes]:
    rng = random.Random(29)
    text = json.dumps(BASE).encode()
    values = [b"-1", b"1e308", b"18446744073709551616", b'"7"', b"null", b"true", b"[]", b"{}", b'"\\ud800"',
              b"0.0000001", b"-0", b'"x\\"y"', b"1.5e3"]
    out = []
    for _ in range(n):
        data = bytearray(text)
        kind = rng.randrange(4)
        if kind == 0:  # replace a number or string value with an odd one
            colons = [i for i, c in enumerate(data) if c == ord(":")]
            i = rng.choice(colons) + 1
            j = i + 1
            while j < len(data) and data[j] not in b",}]":
                j += 1
            data[i:j] = b" " + rng.choice(values)
        elif kind == 1:  # flip a byte
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:  # truncate
            del data[rng.randrange(1, len(data)):]
        else:  # duplicate a slice
            i = rng.randrange(len(data))
            data[i:i] = data[i:i + rng.randrange(1, 40)]
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("case", range(120))
def test_mutated_traces_give_the_same_table_or_both_refuse(tmp_path, monkeypatch, case):
    path = tmp_path / "t.json"
    path.write_bytes(_mutants()[case])
    _same(_table(path, True, monkeypatch), _table(path, False, monkeypatch))
