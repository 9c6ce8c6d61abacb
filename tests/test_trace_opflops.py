"""Per-operator FLOPs and bytes from ``record_shapes``: every formula against torch's own
``FlopCounterMode`` on the same shapes, and the shapes read from a trace torch.profiler itself wrote."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count  # noqa: E402

from lmprof.trace.load import load_trace  # noqa: E402
from lmprof.trace.opflops import COUNTERS, op_cost, op_flops  # noqa: E402

F = torch.nn.functional

# (operator, inputs) run under FlopCounterMode and under torch.profiler with record_shapes
CASES = [
    ("aten::mm", lambda: (torch.randn(24, 40), torch.randn(40, 56)), torch.mm),
    ("aten::addmm", lambda: (torch.randn(56), torch.randn(24, 40), torch.randn(40, 56)), torch.addmm),
    ("aten::bmm", lambda: (torch.randn(3, 24, 40), torch.randn(3, 40, 56)), torch.bmm),
    ("aten::baddbmm", lambda: (torch.randn(3, 24, 56), torch.randn(3, 24, 40), torch.randn(3, 40, 56)), torch.baddbmm),
    ("aten::matmul", lambda: (torch.randn(2, 3, 24, 40), torch.randn(40, 56)), torch.matmul),
    ("aten::matmul", lambda: (torch.randn(4, 1, 24, 40), torch.randn(3, 40, 8)), torch.matmul),
    ("aten::matmul", lambda: (torch.randn(40), torch.randn(3, 40, 8)), torch.matmul),
    ("aten::linear", lambda: (torch.randn(5, 7, 40), torch.randn(56, 40), torch.randn(56)), F.linear),
    ("aten::linear", lambda: (torch.randn(7, 40), torch.randn(56, 40)), F.linear),
]
# what record_shapes writes after the tensors given above: addmm's and baddbmm's beta and alpha, an
# absent bias (as torch.profiler wrote them in test_trace_shapes_are_kept_as_recorded's trace)
RECORDED_AFTER = {"aten::addmm": ("Scalar", "Scalar"), "aten::baddbmm": ("Scalar", "Scalar")}


def _recorded(name: str, args) -> tuple[tuple, tuple]:
    """The dims and types record_shapes writes for a call of ``name`` on these fp32 tensors."""
    after = RECORDED_AFTER.get(name, ("",) if name == "aten::linear" and len(args) == 2 else ())
    return tuple(tuple(a.shape) for a in args) + ((),) * len(after), ("float",) * len(args) + after


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matmul_formulas_equal_flop_counter_mode(case) -> None:
    name, make, fn = CASES[case]
    args = make()
    with FlopCounterMode(display=False) as fc:
        fn(*args)
    cost = op_cost(name, *_recorded(name, args))
    assert cost is not None and cost.flops == fc.get_total_flops() > 0
    # least bytes: inputs read once, output written once, 4 bytes each
    out = fn(*args)
    assert cost.bytes == 4 * (sum(a.numel() for a in args) + out.numel())
    assert cost.dtype == "fp32"


def test_mm_is_2mnk() -> None:
    assert op_cost("aten::mm", ((24, 40), (40, 56)), ("float", "float")).flops == 2 * 24 * 40 * 56
    assert op_cost("aten::bmm", ((3, 24, 40), (3, 40, 56)), ("c10::BFloat16",) * 2).flops == 2 * 3 * 24 * 40 * 56
    assert op_cost("aten::mm", ((24, 40), (41, 56)), ("float", "float")) is None  # shapes that do not fit


@pytest.mark.parametrize("q,k,v", [((2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 12)), ((1, 8, 10, 16), (1, 2, 10, 16), (1, 2, 10, 16))])
def test_attention_equals_torch_formulas(q, k, v) -> None:
    """torch's own sdpa formulas (FlopCounterMode's, GQA included): forward and backward."""
    def call(name, tensors):  # the other inputs absent or not tensors, as many as torch's schema has
        n = len(torch._C._jit_get_schemas_for_operator(name)[0].arguments) - len(tensors)
        return tuple(tensors) + ((),) * n, ("float",) * len(tensors) + ("",) * n

    for name in ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                 "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"):
        assert op_cost(name, *call(name, (q, k, v))).flops == sdpa_flop_count(q, k, v)
    out = q[:3] + (v[3],)
    for name in ("aten::_scaled_dot_product_flash_attention_backward",
                 "aten::_scaled_dot_product_efficient_attention_backward"):
        got = op_cost(name, *call(name, (out, q, k, v)))
        assert got.flops == sdpa_backward_flop_count(out, q, k, v)
    # an older torch recorded sdpa without `enable_gqa` (7 inputs, not 8): an operator with no out=
    # overload reads every tensor it is given, whatever its arity
    dims, types = call("aten::scaled_dot_product_attention", (q, k, v))
    assert op_cost("aten::scaled_dot_product_attention", dims[:-1], types[:-1]).flops == sdpa_flop_count(q, k, v)


def test_elementwise_is_one_flop_per_output_element() -> None:
    c = op_cost("aten::add", ((4, 1, 8), (3, 1), ()), ("float", "float", "Scalar"))
    assert c.flops == 4 * 3 * 8 and c.bytes == 4 * (32 + 3 + 96)
    assert op_cost("aten::mul_", ((5, 6), ()), ("c10::Half", "Scalar")).flops == 30


def test_every_counter_is_keyed_by_an_aten_name() -> None:
    assert all(n.startswith("aten::") for n in COUNTERS)


def test_the_roles_table_is_what_torchs_schemas_give() -> None:
    """src/lmprof/trace/op_roles.py is scripts/gen_op_roles.py's output for the installed torch (the
    line naming torch's version aside): rerun the script after adding a counter or changing torch."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gen_op_roles", root / "scripts" / "gen_op_roles.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.without_version(gen.TABLE.read_text()) == gen.without_version(gen.render()), \
        "src/lmprof/trace/op_roles.py is stale: run scripts/gen_op_roles.py"


def test_out_calls_as_torch_records_them(tmp_path) -> None:
    """out= calls recorded by torch.profiler (the out tensor sized right, or empty and resized by the
    call): FLOPs as FlopCounterMode counts them, bytes the inputs read and the result written, from
    the tensors' own sizes; the out tensor is not read."""
    from torch.profiler import ProfilerActivity, profile

    a, b, bias, x = torch.randn(24, 40), torch.randn(40, 56), torch.randn(56), torch.randn(8, 16)
    calls = [  # (operator, call, tensors read, result)
        ("aten::mm", lambda o: torch.mm(a, b, out=o), (a, b), torch.mm(a, b)),
        ("aten::addmm", lambda o: torch.addmm(bias, a, b, out=o), (bias, a, b), torch.addmm(bias, a, b)),
        ("aten::mul", lambda o: torch.mul(x, x, out=o), (x, x), x * x),
        ("aten::add", lambda o: torch.add(x, x, alpha=2, out=o), (x, x), x + x),
    ]
    for name, call, read, result in calls:
        with FlopCounterMode(display=False) as fc:
            call(torch.empty_like(result))
        for out in (torch.empty_like(result), torch.empty(0)):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                call(out)
            path = tmp_path / "out.json"
            prof.export_chrome_trace(str(path))
            rows = [r for r in op_flops(load_trace(path), top=100).rows if r.name == name]
            want = sum(t.numel() * t.element_size() for t in read) + result.numel() * result.element_size()
            assert len(rows) == 1 and rows[0].bytes == want, (name, out.shape)
            if name in ("aten::mm", "aten::addmm"):
                assert rows[0].flops == fc.get_total_flops()
            else:
                assert rows[0].flops == result.numel()


def test_result_dtype_as_torch_promotes(tmp_path) -> None:
    """Calls whose first tensor is no value of the result's dtype, recorded by torch.profiler: a 0-d
    double with a float tensor, where's bool condition. The row's dtype is the result's, and its
    bytes the inputs' and the result's own sizes."""
    from torch.profiler import ProfilerActivity, profile

    x, half = torch.randn(8, 16), torch.tensor(0.5, dtype=torch.float64)
    calls = [("aten::mul", lambda: torch.mul(half, x), (half, x)), ("aten::where", lambda: torch.where(x > 0, x, x), None)]
    for name, call, read in calls:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            result = call()
        path = tmp_path / "promote.json"
        prof.export_chrome_trace(str(path))
        (row,) = [r for r in op_flops(load_trace(path), top=100).rows if r.name == name]
        read = read or (x > 0, x, x)
        assert row.dtype == "fp32" and result.dtype == torch.float32
        assert row.bytes == sum(t.numel() * t.element_size() for t in read) + result.numel() * result.element_size()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    made = [(name, make(), fn) for name, make, fn in CASES]
    q = torch.randn(2, 4, 16, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            for _, args, fn in made:
                fn(*args)
            F.scaled_dot_product_attention(q, q, q)
            torch.add(q, q)
    out = tmp_path_factory.mktemp("shapes") / "trace.json"
    prof.export_chrome_trace(str(out))
    with FlopCounterMode(display=False) as fc:
        for _ in range(2):
            for _, args, fn in made:
                fn(*args)
    return out, made, fc.get_total_flops()


def test_trace_shapes_are_kept_as_recorded(recorded) -> None:
    path, _, _ = recorded
    t = load_trace(path)
    raw = [e for e in json.loads(path.read_text())["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})]
    assert len(t.shapes) == len(raw) > 0
    names = t.events["name"].to_numpy()[t.shapes["row"].to_numpy()]
    # events are sorted by time, the raw list is in file order: compare as multisets
    want = sorted((e["name"], json.dumps(e["args"]["Input Dims"])) for e in raw)
    got = sorted((n, json.dumps(d, default=list).replace("(", "[").replace(")", "]")) for n, d in
                 zip(names, t.shapes["dims"]))
    assert [w[0] for w in want] == [g[0] for g in got]
    assert all(json.loads(w[1]) == json.loads(g[1].replace(",]", "]")) for w, g in zip(want, got))


def test_trace_flops_equal_flop_counter_mode(recorded) -> None:
    """Totals over outermost operators (aten::linear, not the aten::addmm inside it) equal
    FlopCounterMode over the same calls; every mm/addmm/bmm row is 2·m·n·k of its recorded shapes."""
    path, made, truth = recorded
    rep = op_flops(load_trace(path), top=1000)
    assert rep is not None and rep.time_source == "cpu"
    matmul_like = {n for n, _, _ in CASES}
    outer = [r for r in rep.rows if not r.nested and r.name in matmul_like]
    assert sum(r.flops * r.count for r in outer) == truth
    for r in rep.rows:
        if r.name == "aten::mm":
            dims = json.loads(r.shapes)
            (m, k), (_, n) = dims[0], dims[1]
            assert r.flops == 2 * m * n * k
        assert r.time_us >= 0
        if r.time_us > 0:
            assert math.isclose(r.achieved_flops_per_s, r.flops * r.count / (r.time_us * 1e-6))
    sdpa = [r for r in rep.rows if r.name == "aten::scaled_dot_product_attention"]
    assert sdpa and sdpa[0].flops == sdpa_flop_count((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8))
    assert not sdpa[0].nested
    assert all(r.nested for r in rep.rows if r.name == "aten::_scaled_dot_product_flash_attention_for_cpu")


def test_no_shapes_no_report() -> None:
    from pathlib import Path

    t = load_trace(Path(__file__).parent / "data" / "traces" / "v100_train_rank0.json.gz")
    assert t.shapes.empty and op_flops(t) is None


def test_cli_roofline_on_a_named_device(capsys) -> None:
    """`--device h100`: each row's bound and % of roof by hand from the peak table's own numbers."""
    from pathlib import Path

    from lmprof.cli.main import main
    from lmprof.hardware.peaks import find_device

    path = Path(__file__).parent / "data" / "traces" / "gpu_2rank_rank0.json.gz"
    assert main(["analyze", str(path), "--json", "--device", "h100", "--top", "5"]) == 0
    tr = json.loads(capsys.readouterr().out)["traces"][0]
    ops, roof = tr["op_flops"], tr["op_roofline"]
    assert ops["time_source"] == "device" and len(ops["rows"]) == len(roof["rows"]) == 5
    h100 = find_device("h100")
    peak, bw = h100.flops["fp32"], h100.bytes_per_s
    for o, r in zip(ops["rows"], roof["rows"]):
        assert (o["name"], o["shapes"]) == (r["name"], r["shapes"]) and o["dtype"] == "fp32"
        f, q, t = o["flops"] * o["count"], o["bytes"] * o["count"], o["time_us"] * 1e-6
        frac = max(f / t / peak, q / t / bw)
        assert r["roof_pct"] == pytest.approx(100 * frac, abs=1e-3)
        want = "overhead-bound" if frac < 0.1 else ("compute-bound" if f / q >= peak / bw else "memory-bound")
        assert r["bound"] == want
    assert main(["analyze", str(path), "--device", "no-such-gpu"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_cli_table_on_a_cpu_trace(recorded, capsys) -> None:
    from lmprof.cli.main import main

    path, _, _ = recorded
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "FLOPs from recorded shapes" in out and "time: CPU time" in out and "aten::mm" in out


def test_distinct_shapes_are_bounded(tmp_path, monkeypatch) -> None:
    """A trace of all-different shapes cannot grow the table without limit: beyond the cap, new
    shapes are left out with a note, by both readers alike."""
    import lmprof.trace.kineto.columns as columns
    from lmprof.trace.kineto import scan

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": i, "dur": 1, "pid": 1, "tid": 1,
               "args": {"Input Dims": [[i + 1, 2], [2, 3]], "Input type": ["float", "float"]}} for i in range(50)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(columns, "MAX_DISTINCT_SHAPES", 20)
    for native in (True, False):
        monkeypatch.setattr(scan, "NATIVE", native and scan._scan is not None)
        t = load_trace(path, workers=1)
        assert len(t.shapes) == 20 and t.shapes["dims"].iloc[0] == ((1, 2), (2, 3))
        assert any("30 operator(s) with input shapes beyond the first 20" in n for n in t.notes)


def test_device_time_is_the_kernels_each_op_launched() -> None:
    """On a GPU trace, an operator row's time is the duration of the kernels whose launch (runtime
    call, by correlation id) lies inside its calls: computed here from the raw JSON events."""
    import gzip
    from pathlib import Path

    path = Path(__file__).parent / "data" / "traces" / "gpu_2rank_rank0.json.gz"
    evs = json.loads(gzip.open(path).read())["traceEvents"]
    xs = [e for e in evs if e.get("ph") == "X"]
    kernels: dict[int, float] = {}
    for e in xs:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            c = e.get("args", {}).get("correlation")
            kernels[c] = kernels.get(c, 0.0) + e["dur"]
    runtime = [e for e in xs if e.get("cat") == "cuda_runtime"]
    rep = op_flops(load_trace(path), top=5)
    assert rep.time_source == "device"
    for row in rep.rows:
        calls = [e for e in xs if e.get("cat") == "cpu_op" and e["name"] == row.name
                 and json.dumps(e["args"].get("Input Dims")).replace(" ", "") == row.shapes.replace(" ", "")]
        assert len(calls) == row.count
        want = 0.0
        for op in calls:
            for r in runtime:
                if (r["tid"] == op["tid"] and r["pid"] == op["pid"] and op["ts"] <= r["ts"]
                        and r["ts"] + r["dur"] <= op["ts"] + op["dur"]):
                    want += kernels.get(r["args"].get("correlation"), 0.0)
        assert row.time_us == pytest.approx(want, abs=1e-6), row.name


def test_real_trace_op_flops_equal_a_hand_count(monkeypatch) -> None:
    """On a real record_shapes trace (HTA's, recorded on GPUs), by both readers: ``ops_with_shapes``
    is the number of raw operator events with an "Input Dims" list of at most 64 inputs (beyond, the
    documented bound: 7 events here, with up to 300), and every fp32 mm / addmm / bmm
    row has as many calls as raw events of that name, shapes and dtypes, 2·m·k·n FLOPs (times the
    batch) and 4 bytes per element of its tensor inputs and output, all computed here from the JSON."""
    import gzip
    from pathlib import Path

    from lmprof.trace.kineto import scan

    path = Path(__file__).parent / "data" / "traces" / "gpu_2rank_rank0.json.gz"
    ops = [e for e in json.loads(gzip.open(path).read())["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "cpu_op" and isinstance(e.get("args", {}).get("Input Dims"), list)
           and len(e["args"]["Input Dims"]) <= 64]
    for native in (True, False):
        monkeypatch.setattr(scan, "NATIVE", native and scan._scan is not None)
        rep = op_flops(load_trace(path, workers=1), top=10_000)
        assert rep is not None and rep.ops_with_shapes == len(ops)
        checked = 0
        for r in rep.rows:
            if r.name not in ("aten::mm", "aten::addmm", "aten::bmm") or r.dtype != "fp32":
                continue
            dims = json.loads(r.shapes)
            calls = [e for e in ops if e["name"] == r.name and e["args"]["Input Dims"] == dims
                     and all(t in ("float", "Scalar") for t in e["args"]["Input type"])]
            a, b = (dims[1], dims[2]) if r.name == "aten::addmm" else (dims[0], dims[1])
            batch = a[0] if r.name == "aten::bmm" else 1
            m, k, n = a[-2], a[-1], b[-1]
            assert r.count == len(calls) > 0
            assert r.flops == 2 * batch * m * k * n
            inputs = sum(math.prod(d) for d in dims if d)  # the Scalars are []
            assert r.bytes == 4 * (inputs + batch * m * n)
            checked += 1
        assert checked >= 10
