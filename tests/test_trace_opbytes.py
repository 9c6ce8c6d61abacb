"""Bytes per operator call: the tensors read once and the one written once, with each input's role
(read, written by out=, read and written in place) taken from torch's schemas. Checked against byte
counts by hand on a trace written here event by event, and on a real A100 trace from its raw JSON."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from lmprof.trace.load import load_trace
from lmprof.trace.opflops import op_cost, op_flops

ROOT = Path(__file__).resolve().parents[1]
A100 = ROOT / "benchmarks" / "data" / "a100_record_shapes_rank0.json.gz"
F, D = 4, 8  # bytes of a float, a double
M, K, N = 64, 48, 32
E = M * N  # elements of an [M, N] tensor

# (name, Input Dims, Input type, FLOPs, bytes by hand); None: not counted
CALLS = [
    # mul.Tensor, mul.out (into a tensor of the right size, into an empty one torch resizes), mul.out with
    # a 0-d double (a Python number), mul.Scalar
    ("aten::mul", [[M, N], [M, N]], ["float", "float"], E, F * 3 * E),
    ("aten::mul", [[M, N], [M, N], [M, N]], ["float", "float", "float"], E, F * 3 * E),
    ("aten::mul", [[M, N], [M, N], [0]], ["float", "float", "float"], E, F * 3 * E),
    ("aten::mul", [[M, N], [], [M, N]], ["float", "double", "float"], E, F * E + D + F * E),
    ("aten::mul", [[M, N], []], ["float", "Scalar"], E, F * 2 * E),
    # add.Tensor (alpha a Scalar), add.out, add.Scalar, add_ in place (self read and written)
    ("aten::add", [[M, N], [M, N], []], ["float", "float", "Scalar"], E, F * 3 * E),
    ("aten::add", [[M, N], [M, N], [], [M, N]], ["float", "float", "Scalar", "float"], E, F * 3 * E),
    ("aten::add", [[M, N], [], []], ["float", "Scalar", "Scalar"], E, F * 2 * E),
    ("aten::add_", [[M, N], [N], []], ["float", "float", "Scalar"], E, F * (E + N + E)),
    # mm, mm.out, mm.dtype (a trailing ScalarType, no out), addmm (beta, alpha), addmm.out
    ("aten::mm", [[M, K], [K, N]], ["float", "float"], 2 * M * K * N, F * (M * K + K * N + M * N)),
    ("aten::mm", [[M, K], [K, N], [M, N]], ["float"] * 3, 2 * M * K * N, F * (M * K + K * N + M * N)),
    ("aten::mm", [[M, K], [K, N], []], ["float", "float", "Scalar"], 2 * M * K * N, F * (M * K + K * N + M * N)),
    ("aten::addmm", [[N], [M, K], [K, N], [], []], ["float"] * 3 + ["Scalar"] * 2, 2 * M * K * N,
     F * (N + M * K + K * N + M * N)),
    ("aten::addmm", [[N], [M, K], [K, N], [], [], [M, N]], ["float"] * 3 + ["Scalar"] * 2 + ["float"], 2 * M * K * N,
     F * (N + M * K + K * N + M * N)),
    # unary out=: abs.out into an empty tensor (as torch's abs itself calls it)
    ("aten::abs", [[1, E], [0]], ["double", "double"], E, D * 2 * E),
    # three tensors, the last one read (no out=): lerp.Tensor, clamp.Tensor; div.Tensor_mode's last is a string
    ("aten::lerp", [[M, N], [M, N], [M, N]], ["float"] * 3, E, F * 4 * E),
    ("aten::clamp", [[M, N], [N], [N]], ["float"] * 3, E, F * (2 * E + 2 * N)),
    ("aten::div", [[M, N], [M, N], []], ["float", "float", ""], E, F * 3 * E),
    ("aten::div", [[M, N], [M, N], [M, N]], ["float"] * 3, E, F * 3 * E),  # div.out
    # the dtype computed in and written: a 0-d double read with a float tensor (a Python number) computes
    # in float; where's bool condition is no value of its float result
    ("aten::sub", [[], [M, N], []], ["double", "float", "Scalar"], E, D + F * 2 * E),
    ("aten::mul", [[], [M, N], [M, N]], ["double", "float", "float"], E, D + F * 2 * E),
    ("aten::where", [[M, N], [M, N], []], ["bool", "float", "float"], E, E + F * E + F + F * E),
    ("aten::add_", [[N], [N], []], ["double", "float", "Scalar"], N, D * N + F * N + D * N),  # in place: double
    ("aten::where", [[E], [E], [E]], ["bool", "long", "long"], E, E + 3 * D * E),
    ("aten::where", [[E], [], []], ["bool", "Scalar", "Scalar"], E, None),  # its dtype: the numbers' (not recorded)
    # where(condition) is nonzero(), no elementwise select; a call that fits no schema of an operator
    # with out= overloads (four tensors to mul) is not guessed at
    ("aten::where", [[E]], ["bool"], None, None),
    ("aten::mul", [[M, N], [M, N], [M, N], [M, N]], ["float"] * 4, None, None),
]


def _trace(tmp_path: Path) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1,
               "args": {"Input Dims": dims, "Input type": types}} for i, (name, dims, types, _, _) in enumerate(CALLS)]
    path = tmp_path / "calls.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_bytes_by_hand_per_call(tmp_path: Path) -> None:
    """Each call read from a trace written event by event: its own row, FLOPs and bytes by hand."""
    rep = op_flops(load_trace(_trace(tmp_path)), top=100)
    rows = {(r.name, r.shapes.replace(" ", ""), r.dtype): r for r in rep.rows}
    assert rep.ops_with_shapes == len(CALLS) and rep.counted == sum(c[3] is not None for c in CALLS)
    for name, dims, types, flops, nbytes in CALLS:
        want = None if flops is None else (flops, nbytes)
        got = op_cost(name, tuple(tuple(d) for d in dims), tuple(types))
        assert (None if got is None else (got.flops, got.bytes)) == want, (name, dims, types)
        if flops is None:
            assert (name, json.dumps(dims).replace(" ", "")) not in {(k[0], k[1]) for k in rows}
            continue
        row = next(r for k, r in rows.items() if k[:2] == (name, json.dumps(dims).replace(" ", "")))
        assert (row.flops, row.bytes, row.count) == (flops, nbytes, 1), (name, dims)
        floating = "fp64" if types[0] == "double" and dims[0] else "fp32"
        assert row.dtype == (None if "long" in types or nbytes is None else floating), (name, dims)


@pytest.fixture(scope="module")
def a100():
    if not A100.exists():
        pytest.skip("benchmarks/data is not in this checkout")
    raw = json.loads(gzip.open(A100).read())["traceEvents"]
    return load_trace(A100), raw


def test_a100_trace_elementwise_within_the_bandwidth_roof(a100) -> None:
    """HTA's A100 trace: every fp32 elementwise row (out= calls such as ``mul`` with three inputs
    among them) at or under 100% of the A100's roof, its bytes the tensors read and written by hand."""
    from lmprof.analysis.op_roofline import op_roofline
    from lmprof.hardware.peaks import find_device
    from lmprof.trace.opflops import _ELEMENTWISE

    table, _ = a100
    ops = op_flops(table, top=10_000)
    dev = find_device("a100")
    roof = op_roofline(ops, dev.name, dev.flops, dev.bytes_per_s)
    names = {f"aten::{n}" for n in _ELEMENTWISE} | {f"aten::{n}_" for n in _ELEMENTWISE}
    checked = 0
    for o, r in zip(ops.rows, roof.rows):
        if o.name not in names or o.dtype != "fp32" or r.roof_pct is None:
            continue
        assert r.roof_pct <= 100.0, (o.name, o.shapes, r.roof_pct)
        checked += 1
    assert checked >= 20
    # the call that was at 127%: mul.out(self [4, 2798, 2798], a 0-d double, out): one read, one write
    mul = next(o for o in ops.rows if o.name == "aten::mul" and o.shapes == "[[4, 2798, 2798], [], [4, 2798, 2798]]")
    assert mul.bytes == 4 * 4 * 2798 * 2798 + 8 + 4 * 4 * 2798 * 2798


def test_a100_trace_mm_bytes_by_hand(a100) -> None:
    """Every mm / addmm row: 4·(m·k + k·n + m·n) bytes (+ 4·n of bias), m, k, n from the raw JSON."""
    table, raw = a100
    ops = op_flops(table, top=10_000)
    calls = {}
    for e in raw:
        if e.get("cat") == "cpu_op" and e.get("name") in ("aten::mm", "aten::addmm") and "Input Dims" in e.get("args", {}):
            dims, types = e["args"]["Input Dims"], e["args"]["Input type"]
            a, b = (dims[1], dims[2]) if e["name"] == "aten::addmm" else (dims[0], dims[1])
            (m, k), (_, n) = a, b
            bias = math.prod(dims[0]) if e["name"] == "aten::addmm" else 0
            assert all(t in ("float", "Scalar") for t in types)
            calls[(e["name"], json.dumps(dims))] = 4 * (m * k + k * n + m * n + bias)
    rows = [r for r in ops.rows if r.name in ("aten::mm", "aten::addmm")]
    assert len(rows) == len(calls) >= 5
    for r in rows:
        assert r.bytes == calls[(r.name, r.shapes)], (r.name, r.shapes)
