"""Per-operator memory of a ``profile_memory=True`` trace against torch's own ``key_averages()``,
and the peak against the allocator's own "Total Allocated" in the trace JSON."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from lmprof.cli.main import main  # noqa: E402
from lmprof.trace.load import load_trace  # noqa: E402
from lmprof.trace.opmemory import TIMELINE_POINTS, _timeline, memory_report  # noqa: E402


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny forward + backward + SGD step, three times, with annotations around parts of it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    x = torch.randn(64, 64)
    w = torch.randn(64, 64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            with record_function("model_inference_cpu"):
                with record_function("matmul_add"):
                    y = torch.mm(x, w) + 1
                z = torch.addmm(y, x, w).relu().sum()
            z.backward()
            opt.step()
            opt.zero_grad()
    out = tmp_path_factory.mktemp("mem") / "trace.json"
    prof.export_chrome_trace(str(out))
    return out, prof.key_averages()


def test_per_op_bytes_equal_key_averages(recorded) -> None:
    path, averages = recorded
    rep = memory_report(load_trace(path), top=10_000)
    assert rep is not None
    ours = {r.name: r for r in rep.top}
    truth = {e.key: e for e in averages if e.key != "[memory]"}
    assert set(ours) == set(truth)
    for name, e in truth.items():
        r = ours[name]
        assert (r.count, r.cpu_bytes, r.self_cpu_bytes) == (e.count, e.cpu_memory_usage, e.self_cpu_memory_usage), name
        assert r.cpu_allocated_bytes - r.cpu_freed_bytes == r.cpu_bytes
        assert r.device_bytes == r.self_device_bytes == 0
    # allocator events inside no operator: torch's own "[memory]" row
    outside = [e.cpu_memory_usage for e in averages if e.key == "[memory]"]
    assert rep.outside_bytes == (outside[0] if outside else 0)
    # something real was measured: the matmuls allocate their 64x64 float outputs
    assert ours["aten::mm"].self_cpu_bytes >= 64 * 64 * 4


def test_peak_and_timeline_equal_the_allocator_events(recorded) -> None:
    path, _ = recorded
    mem = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    rep = memory_report(load_trace(path))
    (cpu,) = rep.devices
    assert cpu.device == "cpu" and cpu.events == len(mem) == rep.events
    assert cpu.peak_allocated_bytes == max(e["args"]["Total Allocated"] for e in mem)
    assert cpu.allocated_bytes == sum(e["args"]["Bytes"] for e in mem if e["args"]["Bytes"] > 0)
    assert cpu.freed_bytes == -sum(e["args"]["Bytes"] for e in mem if e["args"]["Bytes"] < 0)
    assert max(cpu.timeline_bytes) == cpu.peak_allocated_bytes
    assert len(cpu.timeline_us) == len(cpu.timeline_bytes) <= TIMELINE_POINTS


def test_timeline_keeps_the_peak_when_thinned() -> None:
    import numpy as np

    t = np.arange(10_000, dtype=float)
    v = (np.sin(t / 50) * 1000).astype(np.int64)
    v[7_777] = 10**9
    times, values = _timeline(t, v)
    assert len(values) == TIMELINE_POINTS and max(values) == 10**9 and 7_777.0 in times


def test_cli_shows_memory(recorded, capsys) -> None:
    path, _ = recorded
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]["memory"]
    assert doc["devices"][0]["peak_allocated_bytes"] > 0 and doc["top"][0]["name"] == "aten::mm"
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "memory cpu: peak allocated" in out and "Memory by operator" in out


RANDN_BYTES = 8_131_072  # torch.randn of 2,032,768 float32s


@pytest.fixture(scope="module")
def randn_trace(tmp_path_factory):
    """``torch.randn`` allocating 8,131,072 bytes (through ``aten::empty``) under profile_memory."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.randn(RANDN_BYTES // 4)
        x.add_(1)
    del x
    out = tmp_path_factory.mktemp("randn") / "trace.json"
    prof.export_chrome_trace(str(out))
    return out, {e.key: e for e in prof.key_averages()}


def test_randn_has_a_row_with_its_inclusive_bytes(randn_trace) -> None:
    """Ranked by inclusive bytes (the default, as torch's table sorted by cpu_memory_usage) aten::randn
    heads the table with torch's own figures; by self bytes its bytes are aten::empty's."""
    path, truth = randn_trace
    assert truth["aten::randn"].cpu_memory_usage == RANDN_BYTES  # the truth is torch's, not ours
    rep = memory_report(load_trace(path), top=1)
    assert rep is not None and [r.name for r in rep.top] == ["aten::randn"]
    (randn,) = rep.top
    e = truth["aten::randn"]
    assert (randn.count, randn.cpu_bytes, randn.self_cpu_bytes) == (e.count, e.cpu_memory_usage, e.self_cpu_memory_usage)
    assert [r.name for r in rep.top_self] == ["aten::empty"]
    assert rep.top_self[0].self_cpu_bytes == truth["aten::empty"].self_cpu_memory_usage == RANDN_BYTES
    # every row of both rankings: torch's figures
    full = memory_report(load_trace(path), top=10_000)
    for r in full.top + full.top_self:
        t = truth[r.name]
        assert (r.count, r.cpu_bytes, r.self_cpu_bytes) == (t.count, t.cpu_memory_usage, t.self_cpu_memory_usage)
    assert {r.name for r in full.top} == {r.name for r in full.top_self}
    assert [r.cpu_bytes for r in full.top] == sorted((r.cpu_bytes for r in full.top), key=lambda b: -max(b, 0))


def test_cli_sort_inclusive_by_default_and_self_on_request(randn_trace, capsys) -> None:
    path, _ = randn_trace
    assert main(["analyze", str(path), "--top", "1"]) == 0
    table = " ".join(capsys.readouterr().out.split()).split("Memory by operator")[1]
    assert "by inclusive bytes" in table and "aten::randn" in table and "aten::empty" not in table
    assert main(["analyze", str(path), "--top", "1", "--sort", "self"]) == 0
    table = " ".join(capsys.readouterr().out.split()).split("Memory by operator")[1]
    assert "by self bytes" in table and "aten::empty" in table and "aten::randn" not in table
    assert main(["analyze", str(path), "--json", "--top", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]["memory"]
    assert doc["top"][0]["name"] == "aten::randn" and doc["top_self"][0]["name"] == "aten::empty"
    assert main(["analyze", str(path), "--sort", "biggest"]) == 2
    err = capsys.readouterr().err
    assert "--sort 'biggest'" in err and len(err.strip().splitlines()) == 1


def test_device_bytes_self_and_inclusive_by_hand(tmp_path) -> None:
    """A trace written event by event: CUDA and CPU allocator events inside nested operators. Each
    operator's device and CPU bytes, self and inclusive, are what the events say by hand, and the
    two rankings count device bytes too."""
    def op(name, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    def mem(ts, nbytes, device_type):
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Bytes": nbytes, "Addr": ts, "Device Type": device_type, "Device Id": 0 if device_type else -1,
                         "Total Allocated": 0, "Total Reserved": 0}}

    events = [op("outer", 0, 100), op("inner", 10, 40), mem(20, 1000, 1), mem(30, 16, 0), mem(60, 500, 1),
              mem(70, 64, 0), mem(80, -1000, 1)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    rep = memory_report(load_trace(path))
    rows = {r.name: r for r in rep.top}
    assert (rows["outer"].device_bytes, rows["outer"].self_device_bytes) == (500, -500)
    assert (rows["inner"].device_bytes, rows["inner"].self_device_bytes) == (1000, 1000)
    assert (rows["outer"].cpu_bytes, rows["outer"].self_cpu_bytes) == (80, 64)
    assert (rows["inner"].cpu_bytes, rows["inner"].self_cpu_bytes) == (16, 16)
    assert [r.name for r in rep.top] == ["inner", "outer"]  # 1016 against 580 inclusive
    assert [r.name for r in rep.top_self] == ["inner", "outer"]  # 1016 against 64 (+0: -500 counts as none)
