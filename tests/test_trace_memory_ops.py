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
