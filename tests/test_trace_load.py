"""The trace loader: columns from real Kineto traces, and a clear DataError for every broken file."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import lmprof.trace.kineto.load as load_mod
import lmprof.trace.read as read_mod
import lmprof.trace.kineto.scan as scan_mod
from lmprof.errors import DataError
from lmprof.trace.load import load_trace

DATA = Path(__file__).parent / "data" / "traces"
COLUMNS = ["name", "cat", "pid", "tid", "ts", "dur", "correlation", "external_id", "seq", "stream", "device"]


@pytest.mark.parametrize(
    "name, x_events, flows, rank, gpu",
    [
        ("a100_alexnet_cuda_sync", 868, 500, 0, True),
        ("amd_mi250_train", 113, 45, None, True),
        ("cpu_only_tiny", 16, 0, 34, False),
        ("cpu_ops_only", 2467, 0, 0, False),
        ("gpu_2rank_rank1", 4676, 0, 1, True),
        ("a100_triton_kernel", 8, 3, None, True),
    ],
)
def test_real_traces(name, x_events, flows, rank, gpu):
    t = load_trace(DATA / f"{name}.json.gz")
    ev = t.events
    assert list(ev.columns) == COLUMNS
    assert len(ev) == x_events and len(t.flows) == flows
    assert t.rank == rank and t.has_gpu is gpu
    assert str(ev["name"].dtype) == "category" and str(ev["cat"].dtype) == "category"
    for col in ("pid", "tid", "correlation", "external_id", "seq", "stream", "device"):
        assert ev[col].dtype == np.int64, col
    assert ev["ts"].dtype == np.float64 and ev["dur"].dtype == np.float64
    assert ev["ts"].is_monotonic_increasing
    assert list(t.flows.columns) == ["id", "ph", "cat", "pid", "tid", "ts"]


def test_v100_values_and_links():
    t = load_trace(DATA / "v100_train_rank0.json.gz")
    ev = t.events
    assert len(ev) == 45420 and t.meta["distributedInfo"]["rank"] == 0
    assert t.meta["deviceProperties"][0]["name"] == "Tesla V100-SXM2-32GB"
    k = ev[ev["cat"] == "kernel"]
    assert len(k) == 4350 and (k["stream"] == 7).all() and (k["device"] == 0).all()
    rt = ev[ev["name"] == "cudaLaunchKernel"]
    assert set(k["correlation"]) == set(rt["correlation"])
    # the one 'Trace' span event has string pid/tid: stable negative codes, names kept in meta
    span = ev[ev["cat"] == "trace"].iloc[0]
    assert t.meta["id_codes"][span["pid"]] == "Spans"
    assert {"fwdbwd", "ac2g"} <= set(t.flows["cat"].astype(str))


def test_rocm_hex_stream_and_categories():
    t = load_trace(DATA / "amd_mi250_train.json.gz")
    ev = t.events
    assert set(ev["cat"].astype(str)) >= {"kernel", "cuda_runtime", "gpu_memcpy", "cpu_op"}
    copy_call = ev[ev["name"] == "hipMemcpyWithStream"].iloc[0]
    assert copy_call["stream"] == 0  # "stream": "0x0" in the trace
    assert (ev[ev["name"] == "hipLaunchKernel"]["correlation"] >= 0).all()


def _write(tmp_path: Path, data: bytes, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


GOOD = {
    "schemaVersion": 1,
    "distributedInfo": {"rank": 3},
    "traceEvents": [
        {"ph": "X", "cat": "Kernel", "name": 'k"}, {', "pid": 0, "tid": 7, "ts": 3, "dur": 1,
         "args": {"stream": 7, "correlation": 5, "nested": [{"a": "}, {"}, {"b": [1, {"c": "]"}]}]}},
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": "main", "ts": 1.5, "dur": 2,
         "args": {"External id": 9, "Sequence number": 4}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        {"ph": "s", "id": 5, "cat": "ac2g", "pid": 1, "tid": 1, "ts": 1.5},
        {"ph": "f", "id": 5, "cat": "ac2g", "pid": 0, "tid": 7, "ts": 3, "bp": "e"},
    ],
    "traceName": "after the events",
}  # fmt: skip


@pytest.mark.parametrize("gz", [False, True])
def test_small_trace_exact(tmp_path, gz):
    data = json.dumps(GOOD, indent=1).encode()
    t = load_trace(_write(tmp_path, gzip.compress(data) if gz else data))
    ev = t.events
    assert list(ev["name"].astype(str)) == ["a", 'k"}, {']  # sorted by ts
    assert list(ev["cat"].astype(str)) == ["cpu_op", "kernel"]  # lower-cased
    assert list(ev["ts"]) == [1.5, 3.0] and list(ev["dur"]) == [2.0, 1.0]
    assert list(ev["correlation"]) == [-1, 5] and list(ev["stream"]) == [-1, 7]
    assert list(ev["external_id"]) == [9, -1] and list(ev["seq"]) == [4, -1]
    assert ev["tid"].iloc[0] < 0 and t.meta["id_codes"][ev["tid"].iloc[0]] == "main"
    assert t.rank == 3 and t.meta["traceName"] == "after the events"
    assert list(t.flows["ph"].astype(str)) == ["s", "f"] and list(t.flows["id"]) == [5, 5]


@pytest.mark.parametrize("read_bytes", [1, 5, 64, 1000])
def test_any_chunking_gives_the_same_table(tmp_path, monkeypatch, read_bytes):
    path = DATA / "amd_mi250_train.json.gz"
    ref = load_trace(path)
    small = _write(tmp_path, json.dumps(GOOD).encode())
    ref_small = load_trace(small)
    monkeypatch.setattr(read_mod, "READ_BYTES", read_bytes)
    monkeypatch.setattr(read_mod, "GZIP_IN", max(1, read_bytes // 3))
    for got, want in ((load_trace(path), ref), (load_trace(small), ref_small)):
        for col in COLUMNS:
            assert np.array_equal(got.events[col].astype(str), want.events[col].astype(str)), col
        assert got.meta == want.meta


def test_json_array_format(tmp_path):
    data = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X", "name": "b", "ts": 0}]'
    t = load_trace(_write(tmp_path, data))
    assert list(t.events["name"].astype(str)) == ["b", "a"] and t.rank is None


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "empty"),
        (b"  \n\t ", "empty"),
        (b"hello", "not a JSON trace"),
        # rocprofv3's JSON (TraceLens' tests/rocprof/908_results.json.gz begins so): said at once, not after 16 MiB
        (b'{"rocprofiler-sdk-tool": [{"metadata": {"pid": 1}}]}', "a rocprofv3 .rocprofiler-sdk. JSON result"),
        (b'{"foo": 1, "bar": [1, 2]}', "no traceEvents"),
        (b'{"traceEvents": []}', "no events"),
        (b'{"traceEvents": [{"ph": "M", "name": "x"}]}', "no complete"),
        (b'{"traceEvents": [{"ph": "X", "ts": [1]}]}', "unexpected trace event"),
        (b'{"traceEvents": []} junk', "not a valid trace JSON"),
        (b'{"traceEvents": [1, 2]}', "unexpected trace event"),
        (b'{"traceEvents": [{"ph": "X"}}]}', "unbalanced"),
        (json.dumps(GOOD).encode()[:-40], "truncated"),
        (json.dumps(GOOD).encode()[:60], "truncated"),
    ],
)
def test_broken_files_raise_data_error(tmp_path, data, message):
    with pytest.raises(DataError, match=message) as err:
        load_trace(_write(tmp_path, data))
    assert "\n" not in str(err.value) and "t.json" in str(err.value)


def test_a_protobuf_trace_is_named_as_one(tmp_path):
    """JAX's XPlane (TraceLens' tests hold a .xplane.pb) and Perfetto's .pftrace are binary: said what they are."""
    for name in ("run.xplane.pb", "trace.pftrace"):
        with pytest.raises(DataError, match="a protobuf trace") as err:
            load_trace(_write(tmp_path, b"\x9d\x01\x0a\x05hello", name))
        assert "\n" not in str(err.value)


def test_truncated_and_corrupt_gzip(tmp_path):
    raw = gzip.compress(json.dumps(GOOD).encode() * 50)
    with pytest.raises(DataError, match="gzip data is truncated"):
        load_trace(_write(tmp_path, raw[: len(raw) // 2], "t.json.gz"))
    real = (DATA / "cpu_only_tiny.json.gz").read_bytes()
    with pytest.raises(DataError, match="gzip data is corrupt"):
        load_trace(_write(tmp_path, real[:20] + bytes(200) + real[220:], "c.json.gz"))


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(DataError, match="folder"):
        load_trace(tmp_path)


def test_junk_inside_events_does_not_hang(tmp_path):
    # 6 MB of objects without separators: must fail fast (scans are linear), not spin
    data = b'{"traceEvents": [' + b'{"a": {"b": 1}}' * 400_000
    with pytest.raises(DataError, match="truncated"):
        load_trace(_write(tmp_path, data))


def test_junk_after_the_events_is_a_note(tmp_path):
    t = load_trace(_write(tmp_path, json.dumps(GOOD).encode() + b" junk"))
    assert len(t.events) > 0 and t.rank is None
    assert any("top-level fields" in n for n in t.notes)


def _same_table(got, want) -> None:
    import pandas as pd

    for frame in ("events", "flows", "comms", "hw", "memory"):
        pd.testing.assert_frame_equal(getattr(got, frame), getattr(want, frame), obj=frame)
    assert got.meta == want.meta and got.notes == want.notes


@pytest.mark.skipif(not hasattr(load_mod.os, "fork"), reason="parallel decoding needs fork")
@pytest.mark.parametrize("native", [True, False], ids=["threads+C", "processes+msgspec"])
@pytest.mark.parametrize("read_bytes", [7, 300, 64 << 10])
def test_parallel_decoding_gives_the_same_table(tmp_path, monkeypatch, read_bytes, native):
    """Chunks decoded by worker threads (C reader) or processes (msgspec) merge into exactly the
    in-process table, including a trace whose strings hold '}, {' so that guessed cuts fail and the
    load is redone in order."""
    if native and not scan_mod.NATIVE:
        pytest.skip("the C reader is not built")
    monkeypatch.setattr(scan_mod, "NATIVE", native)
    paths = [DATA / "v100_train_rank0.json.gz", _write(tmp_path, json.dumps(GOOD).encode())]
    monkeypatch.setattr(read_mod, "READ_BYTES", read_bytes)
    monkeypatch.setattr(read_mod, "GZIP_IN", max(1, read_bytes // 3))
    for path in paths[1:] if read_bytes < 1000 else paths:  # v100 in tiny reads is slow (27 s), not new
        _same_table(load_trace(path, workers=2), load_trace(path, workers=1))


def test_worker_count(tmp_path, monkeypatch):
    small = _write(tmp_path, json.dumps(GOOD).encode())
    assert load_mod.decode_workers(small) == 1  # below PARALLEL_MIN_BYTES
    # a gzipped trace counts by the decompressed size its trailer records
    packed = _write(tmp_path, gzip.compress(b" " * 1000 + json.dumps(GOOD).encode()), "t.json.gz")
    assert read_mod.gzip_size(packed) == 1000 + len(json.dumps(GOOD)) and read_mod.gzip_size(small) == 0
    monkeypatch.setattr(load_mod, "PARALLEL_MIN_BYTES", 1000)
    assert load_mod.decode_workers(packed) == (min(len(load_mod.os.sched_getaffinity(0)), 4)
                                               if load_mod.sys.platform == "linux" else 1)
    monkeypatch.setattr(load_mod, "PARALLEL_MIN_BYTES", 64 << 20)
    monkeypatch.setenv("LMPROF_TRACE_WORKERS", "3")
    assert load_mod.decode_workers(small) == 3


def test_memory_events_are_a_table(tmp_path):
    """The allocator's [memory] instants, values as written (hand-made trace)."""
    events = [
        {"ph": "X", "name": "op", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "i", "s": "t", "name": "[memory]", "ts": 2, "pid": 1, "tid": 1,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Addr": 140000000000000, "Ev Idx": 3,
                  "Total Allocated": 1024, "Total Reserved": 2097152}},
        {"ph": "i", "s": "t", "name": "[memory]", "ts": 5.5, "pid": 1, "tid": 1,
         "args": {"Device Type": 0, "Device Id": -1, "Bytes": -512, "Addr": "0x10", "Ev Idx": 4}},
        {"ph": "i", "name": "not memory", "ts": 6, "pid": 1, "tid": 1, "args": {"Bytes": 7}},
    ]  # fmt: skip
    t = load_trace(_write(tmp_path, json.dumps({"traceEvents": events}).encode()))
    m = t.memory
    assert list(m["ts"]) == [2.0, 5.5] and list(m["bytes"]) == [512, -512]
    assert list(m["device_type"]) == [1, 0] and list(m["device_id"]) == [0, -1]
    assert list(m["addr"]) == [140000000000000, 16] and list(m["ev_idx"]) == [3, 4]
    assert list(m["total_allocated"]) == [1024, -1] and list(m["total_reserved"]) == [2097152, -1]
    assert len(t.events) == 1


@pytest.mark.skipif(not hasattr(load_mod.os, "fork"), reason="parallel decoding needs fork")
def test_cpp_names_do_not_fool_the_cut_guess(tmp_path, monkeypatch):
    """CUDA kernel names hold '{lambda(float)#1}, at::...': a guessed cut there would fail in a worker
    and cost a second, in-process pass; the guess also wants the next event's '{'."""
    name = "void at::native::kernel<at::native::{lambda(float)#1}, at::detail::Array<char*, 2> >(int)"
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": i, "dur": 1} for i in range(400)]
    path = _write(tmp_path, json.dumps({"traceEvents": events}, indent=1).encode())
    monkeypatch.setattr(read_mod, "READ_BYTES", 997)
    real = load_mod._decode_parallel
    outcomes = []
    monkeypatch.setattr(load_mod, "_decode_parallel", lambda p, n, size, flows: outcomes.append(r := real(p, n, size, flows)) or r)
    t = load_trace(path, workers=2)
    assert outcomes and outcomes[0] is not None  # no guess failed
    assert len(t.events) == 400 and set(t.events["name"].astype(str)) == {name}


@pytest.mark.parametrize("dense_first", [True, False])
@pytest.mark.parametrize("workers", [1, 2])
def test_columns_planned_from_the_file_size_hold_every_event(tmp_path, monkeypatch, dense_first, workers):
    """Once its first block is full, each column takes the rows the file is expected to hold in one
    block (planned from the bytes per event so far). Whether the plan is short (small events first)
    or far too large (large events first), the table is the trace's own events, in time order:
    checked against json.loads and a stable sort by ts."""
    import lmprof.trace.kineto.columns as columns_mod

    monkeypatch.setattr(columns_mod, "_FIRST_BLOCK", 16)
    monkeypatch.setattr(read_mod, "READ_BYTES", 400)
    small = [{"ph": "X", "name": f"k{i % 7}", "ts": (i * 7919) % 1000, "dur": 1, "pid": 1, "tid": i % 3}
             for i in range(300)]
    big = [{"ph": "X", "name": "long" * 20, "ts": 1000 + (i * 31) % 97, "dur": 2, "pid": 2, "tid": 0,
            "args": {"note": "x" * 200, "External id": i}} for i in range(60)]
    events = small + big if dense_first else big + small
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = load_trace(path, workers=workers)
    want = sorted(events, key=lambda e: e["ts"])  # sorted() is stable, as the loader's sort
    ev = t.event_cols
    assert ev.labels("name")[ev["name"]].tolist() == [e["name"] for e in want]
    assert ev["ts"].tolist() == [float(e["ts"]) for e in want]
    assert ev["tid"].tolist() == [e["tid"] for e in want]
    assert ev["external_id"].tolist() == [e.get("args", {}).get("External id", -1) for e in want]


def test_a_plan_the_address_space_refuses_falls_back_to_doubling(tmp_path, monkeypatch):
    """A gzip trailer can claim 4 GiB for a small file: under a tight ``ulimit -v`` the planned block
    may be refused (MemoryError); the column then grows block by doubling block as before."""
    import lmprof.trace.kineto.columns as columns_mod

    monkeypatch.setattr(columns_mod, "_FIRST_BLOCK", 16)
    monkeypatch.setattr(read_mod, "READ_BYTES", 400)
    real_empty = np.empty

    def refusing(shape, *args, **kwargs):
        if isinstance(shape, int) and shape > 10_000:
            raise MemoryError
        return real_empty(shape, *args, **kwargs)

    monkeypatch.setattr(columns_mod.np, "empty", refusing)
    monkeypatch.setattr(load_mod, "_json_size", lambda p: 4 << 30)
    events = [{"ph": "X", "name": "a", "ts": i, "dur": 1} for i in range(500)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = load_trace(path, workers=1)
    assert t.event_cols["ts"].tolist() == [float(i) for i in range(500)]


@pytest.mark.parametrize("read_bytes", [997, 2 << 20])
def test_events_after_long_metadata_are_found(tmp_path, monkeypatch, read_bytes):
    """The traceEvents list is searched for in a window doubled from 64 KiB: metadata of 300 KB
    before it (with the key's own text as a decoy inside a string and a nested traceEvents key)
    still gives every event and the metadata."""
    monkeypatch.setattr(read_mod, "READ_BYTES", read_bytes)
    meta = [{"id": i, "name": 'decoy "traceEvents": [', "traceEvents": [i]} for i in range(5000)]
    events = [{"ph": "X", "name": f"e{i}", "ts": i, "dur": 1} for i in range(50)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"deviceProperties": meta, "traceEvents": events}))
    assert path.stat().st_size > 300_000
    t = load_trace(path, workers=1)
    assert t.event_cols["ts"].tolist() == [float(i) for i in range(50)]
    assert t.meta["deviceProperties"] == meta


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("native", [True, False])
def test_flows_can_be_left_out(monkeypatch, workers, native):
    """``flows=False`` (what ``lmprof analyze`` loads with): the same events, every event still
    counted, and an empty flow table with the usual columns."""
    monkeypatch.setattr(scan_mod, "NATIVE", native and scan_mod.NATIVE)
    path = DATA / "a100_alexnet_cuda_sync.json.gz"
    full, lean = load_trace(path, workers=workers), load_trace(path, workers=workers, flows=False)
    assert len(full.flows) == 500 and len(lean.flows) == 0
    assert list(lean.flows.columns) == ["id", "ph", "cat", "pid", "tid", "ts"]
    for col in COLUMNS:
        assert np.array_equal(full.events[col].astype(str), lean.events[col].astype(str)), col
    assert full.notes == lean.notes and full.meta == lean.meta
