"""`lmprof analyze` end to end on real traces: figures, the --json schema, ranks, run folders, errors."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmprof.cli.main import main
from lmprof.errors import DataError
from lmprof.trace import kinds
from lmprof.trace.analyze import analyze_table, find_traces, json_ready
from lmprof.trace.fanout import analyze_path
from lmprof.trace.load import load_trace
from lmprof.trace.timeline import select_device

DATA = Path(__file__).parent / "data" / "traces"

# The documented --json schema (docs/trace-analysis.md): exact key sets.
TOP = {"schema", "source", "time_units", "traces", "ranks", "notes", "collectives", "cross_rank", "cycles"}
TRACE = {
    "path", "rank", "events", "host_span_us", "device", "device_note", "unsupported_device_events", "operators",
    "steps", "notes", "critical_path", "annotations", "memory", "phases", "modules", "op_flops", "device_name",
    "op_roofline", "blocks", "process", "start_us", "end_us", "cycle",
}  # fmt: skip
CRITICAL = {"steps", "step_ms", "segments_pct", "top_kernel", "what_if", "linked"}
CRITICAL_STEP = {"step", "step_us", "segments_us", "kernels_on_path", "collectives"}
WHAT_IF = {"change", "step_ms", "saving_pct"}
DEVICE = {"window", "temporal", "overlap", "idle", "launches", "kernels", "device_ids", "communication", "hardware"}
HARDWARE = {
    "kernels", "with_resources", "resources_time_us", "occupancy_pct", "low_occupancy_time_pct", "blocks_per_sm",
    "small_grid_time_pct", "warps_per_sm", "registers_per_thread", "shared_memory_bytes", "compute_time_us",
    "tensor_core_time_us", "tensor_core_pct", "tensor_core_kernels", "copies",
}  # fmt: skip
COPY_ROW = {"kind", "count", "bytes", "time_us", "achieved_gbps"}
COMMUNICATION = {"collectives", "with_size", "source", "groups", "calls"}
COLL_GROUP = {
    "kind", "dtype", "group_size", "message_bytes", "count", "total_us", "median_us", "algbw_median_gbps",
    "busbw_median_gbps",
}  # fmt: skip
COLL_CALL = {
    "row", "kind", "process_group", "seq", "dtype", "group_size", "message_bytes", "start_us", "time_us",
    "algbw_gbps", "busbw_gbps",
}  # fmt: skip
COLL_MATCH = {"matched", "unmatched", "match_by", "ranks"}
COLL_RANK = {"rank", "matched", "time_us", "wait_us", "transfer_us", "wait_pct"}
WINDOW = {"start_us", "end_us", "span_us", "device_events", "excluded_events", "rule"}
TEMPORAL = {
    "span_us", "busy_us", "compute_us", "communication_us", "memory_us", "idle_us", "non_compute_us",
    "compute_pct", "communication_pct", "memory_pct", "idle_pct", "regions_us",
}  # fmt: skip
OVERLAP = {"communication_total_us", "overlapped_us", "overlap_pct"}
IDLE = {
    "gaps", "idle_us", "sync_us", "host_bound_us", "other_us", "sync_gaps", "host_bound_gaps", "other_gaps",
    "largest_gap_us", "median_gap_us",
}  # fmt: skip
LAUNCHES = {
    "kernels", "linked", "launch_delay_median_us", "launch_delay_p90_us", "launch_delay_max_us",
    "launch_call_median_us", "launch_call_p90_us", "short_kernels", "short_kernels_pct", "short_kernels_time_us",
    "graph_launches", "graph_kernels", "graph_kernels_time_us", "graph_launch_call_median_us",
    "graph_kernels_per_launch_max",
}  # fmt: skip
KERNELS = {"count", "total_us", "by_type_us", "top"}
KERNEL_ROW = {"name", "type", "count", "total_us", "mean_us", "max_us", "share_pct"}
OPERATORS = {"count", "self_us", "top"}
OPERATOR_ROW = {"name", "count", "self_us", "total_us", "mean_self_us", "share_pct"}
STEPS = {"count", "median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms", "steps"}
STEP_ROW = {"step", "start_us", "dur_ms"}
RANKS = {
    "ranks", "measure", "slowest_rank", "fastest_rank", "slowest_over_fastest_pct", "slowest_over_median_pct",
    "communication_min_us", "communication_max_us", "communication_skew_us", "communication_skew_pct",
}  # fmt: skip
RANK_ROW = {
    "rank", "step_ms", "steps", "span_us", "compute_us", "communication_us", "communication_total_us",
    "memory_us", "idle_us", "idle_pct", "host_span_us",
}  # fmt: skip


def _check_schema(doc: dict) -> None:
    assert set(doc) == TOP
    assert doc["schema"] == "lmprof.analyze/1" and doc["source"] == "measured"
    for tr in doc["traces"]:
        assert set(tr) == TRACE
        assert set(tr["operators"]) == OPERATORS
        assert all(set(r) == OPERATOR_ROW for r in tr["operators"]["top"])
        if tr["steps"] is not None:
            assert set(tr["steps"]) == STEPS and all(set(s) == STEP_ROW for s in tr["steps"]["steps"])
        if tr["critical_path"] is not None:
            cp = tr["critical_path"]
            assert set(cp) == CRITICAL and all(set(p) == CRITICAL_STEP for p in cp["steps"])
            assert all(set(w) == WHAT_IF for w in cp["what_if"])
        dev = tr["device"]
        if dev is None:
            assert tr["device_note"] == "no device activity in trace"
            continue
        assert set(dev) == DEVICE
        for key, keys in (("window", WINDOW), ("temporal", TEMPORAL), ("overlap", OVERLAP), ("idle", IDLE),
                          ("launches", LAUNCHES), ("kernels", KERNELS)):  # fmt: skip
            assert set(dev[key]) == keys, key
        assert all(set(r) == KERNEL_ROW for r in dev["kernels"]["top"])
        assert set(dev["hardware"]) == HARDWARE and all(set(c) == COPY_ROW for c in dev["hardware"]["copies"])
        if dev["communication"] is not None:
            cm = dev["communication"]
            assert set(cm) == COMMUNICATION
            assert all(set(g) == COLL_GROUP for g in cm["groups"]) and all(set(c) == COLL_CALL for c in cm["calls"])
    if doc["collectives"] is not None:
        assert set(doc["collectives"]) == COLL_MATCH and all(set(r) == COLL_RANK for r in doc["collectives"]["ranks"])
    if doc["ranks"] is not None:
        assert set(doc["ranks"]) == RANKS and all(set(r) == RANK_ROW for r in doc["ranks"]["ranks"])
    _check_units(doc)


def _check_units(node, key: str = "") -> None:
    """Every non-integer number is named with its unit (or sits in a dict named with one)."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_units(v, key if key.endswith(("_us", "_ms", "_pct")) and not isinstance(v, (dict, list)) else k)
    elif isinstance(node, list):
        for v in node:
            _check_units(v, key)
    elif isinstance(node, float):
        # per-SM / per-thread averages and bytes are counts, not times: named for what they count
        assert key.endswith(("_us", "_ms", "_pct", "_gbps", "_bytes", "_per_sm", "_per_thread", "_per_s",
                             "_per_byte")), key


def _union_py(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def test_v100_device_figures_match_a_plain_python_recount():
    t = load_trace(DATA / "v100_train_rank0.json.gz")
    rep = analyze_table(t)
    dev = rep.device
    ev = t.events
    # HTA's window: device events whose launch started before the last ProfilerStep (#105) began
    steps = ev[ev["name"].astype(str).str.startswith("ProfilerStep#")]
    last_start = steps["ts"].max()
    runtime = ev[ev["cat"] == "cuda_runtime"]
    rt_ts = dict(zip(runtime["correlation"], runtime["ts"]))
    device = ev[ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    kept = [
        (s, s + d, n)
        for s, d, c, n in zip(device["ts"], device["dur"], device["correlation"], device["name"])
        if rt_ts.get(c, np.inf) < last_start
    ]
    assert dev.window.device_events == len(kept) and dev.window.excluded_events == len(device) - len(kept)
    start, end = min(s for s, _, _ in kept), max(e for _, e, _ in kept)
    busy = _union_py([(s, e) for s, e, _ in kept])
    compute = _union_py([(s, e) for s, e, n in kept if "Memcpy" not in n and "Memset" not in n])
    assert dev.temporal.span_us == pytest.approx(end - start)
    assert dev.temporal.busy_us == pytest.approx(busy)
    assert dev.temporal.idle_us == pytest.approx(end - start - busy)
    assert dev.temporal.compute_us == pytest.approx(compute)
    assert dev.temporal.communication_us == 0.0
    assert dev.idle.idle_us == pytest.approx(dev.temporal.idle_us)
    assert dev.idle.sync_us + dev.idle.host_bound_us + dev.idle.other_us == pytest.approx(dev.idle.idle_us)
    assert dev.launches.linked == dev.launches.kernels > 0
    assert rep.steps.count == 5 and rep.operators.top[0].self_us > 0


def test_nccl_trace_has_communication_and_overlap():
    dev = analyze_table(load_trace(DATA / "a100_nccl_rank0.json.gz")).device
    t = dev.temporal
    assert t.communication_us > 0 and t.compute_us > 0
    assert t.compute_us + t.communication_us + t.memory_us + t.idle_us == pytest.approx(t.span_us)
    assert 0 < dev.overlap.overlap_pct < 100
    both = t.regions_us.get("computation+communication", 0.0)
    both += t.regions_us.get("computation+communication+memory", 0.0)
    assert dev.overlap.overlapped_us == pytest.approx(both)
    assert any(k.type == "communication" for k in dev.kernels.top)
    assert dev.idle.sync_gaps >= 1  # cudaEventSynchronize / cudaDeviceSynchronize in this trace


def test_amd_rocm_trace():
    t = load_trace(DATA / "amd_mi250_train.json.gz")
    dev = analyze_table(t).device
    assert dev.launches.kernels == dev.launches.linked == 14  # hipLaunchKernel / hipExtModuleLaunchKernel
    assert dev.idle.sync_gaps >= 1  # hipMemcpyWithStream / hipDeviceSynchronize block the host
    assert dev.temporal.memory_us > 0 and dev.device_ids == [2]
    names = t.events["name"].astype(str)
    assert names[kinds.sync_mask(t)].isin(["hipMemcpyWithStream", "hipDeviceSynchronize"]).all()


def test_cuda_sync_markers_are_not_device_work():
    t = load_trace(DATA / "a100_alexnet_cuda_sync.json.gz")
    sel = select_device(t)
    assert not t.events["cat"].to_numpy()[sel.rows].astype(str).tolist().count("cuda_sync")
    assert analyze_table(t).device.idle.sync_us > 0


def test_cpu_only_rank_34():
    rep = analyze_path(DATA / "cpu_only_tiny.json.gz")
    tr = rep.traces[0]
    assert tr.rank == 34 and tr.device is None and tr.device_note == "no device activity in trace"
    assert tr.operators.count == 4 and rep.ranks is None
    assert analyze_path(DATA / "cpu_ops_only.json.gz").traces[0].operators.top[0].self_us > 0


def test_multi_rank_folder(tmp_path):
    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", tmp_path)
    rep = analyze_path(tmp_path)
    assert [tr.rank for tr in rep.traces] == [0, 1]
    rc = rep.ranks
    assert rc.measure == "step_ms" and {rc.slowest_rank, rc.fastest_rank} == {0, 1}
    steps = {row.rank: row.step_ms for row in rc.ranks}
    assert rc.slowest_over_fastest_pct == pytest.approx(
        100 * (steps[rc.slowest_rank] - steps[rc.fastest_rank]) / steps[rc.fastest_rank]
    )
    comm = [row.communication_total_us for row in rc.ranks]
    assert rc.communication_skew_us == pytest.approx(max(comm) - min(comm))


def test_run_folder_uses_its_trace(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    shutil.copy(DATA / "amd_mi250_train.json.gz", tmp_path / "trace.json.gz")
    assert find_traces(tmp_path) == [tmp_path / "trace.json.gz"]
    assert analyze_path(tmp_path).traces[0].device is not None


# ------------------------------------------------------------------------------------------ CLI


def test_cli_json_schema_single(capsys):
    code = main(["analyze", str(DATA / "a100_nccl_rank0.json.gz"), "--json", "--top", "3"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    _check_schema(doc)
    assert doc["ranks"] is None and len(doc["traces"][0]["device"]["kernels"]["top"]) == 3


def test_cli_json_multi_rank_and_cpu_only(tmp_path, capsys):
    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", tmp_path)
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_schema(doc)
    assert [row["rank"] for row in doc["ranks"]["ranks"]] == [0, 1]
    assert main(["analyze", str(DATA / "cpu_only_tiny.json.gz"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_schema(doc)
    assert doc["traces"][0]["device"] is None and doc["traces"][0]["rank"] == 34


def test_cli_tables(tmp_path, capsys):
    assert main(["analyze", str(DATA / "amd_mi250_train.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "Device time" in out and "Idle gaps" in out and "Top kernels" in out and "steps:" in out
    assert main(["analyze", str(DATA / "cpu_only_tiny.json.gz")]) == 0
    assert "no device activity in trace" in capsys.readouterr().out
    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", tmp_path)
    assert main(["analyze", str(tmp_path)]) == 0
    assert "slowest rank" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, name",
    [
        (b"", "empty.json"),
        (b'{"not": "a trace"}', "other.json"),
        (b"{\"traceEvents\": [{\"ph\": \"X\"", "cut.json"),
        (gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a"}]}', mtime=0)[:25], "cut.json.gz"),
        (None, "missing.json"),
        ("run", "run_without_trace"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, content, name):
    path = tmp_path / name
    if content == "run":
        path.mkdir()
        (path / "run.json").write_text("{}")
    elif content is not None:
        path.write_bytes(content)
    assert main(["analyze", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmprof: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_terminal_name_folding():
    from lmprof.show.analyze_view import fmt_us, short_name

    bn = "void cudnn::bn_bw<float, 32, true>(float, cudnnTensorStruct)"
    assert short_name(bn) == "cudnn::bn_bw<float, 32, true>(…)"
    nested = "void k<4, at::F<float, at::G<float> >, at::A<char*, 2> >(int)"
    assert short_name(nested) == "k<4, at::F<…>, at::A<…> >(…)"
    assert short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert short_name("x" * 100, limit=10) == "x" * 9 + "…"
    assert (fmt_us(12.345), fmt_us(12_345.0), fmt_us(12_345_678.0), fmt_us(None)) == (
        "12.35 us", "12.345 ms", "12.346 s", "n/a"
    )


class _InOrder:
    """A stand-in for ThreadPoolExecutor that runs each task at once, in the caller's thread."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> "_InOrder":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn, *args, **kwargs):
        from concurrent.futures import Future

        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as the executor would
            done.set_exception(exc)
        return done


@pytest.mark.parametrize("name", ["v100_train_rank0", "gpu_2rank_rank0", "amd_mi250_train", "cpu_ops_only"])
def test_two_threads_give_the_one_thread_report(name, monkeypatch):
    """analyze_table shares its analyses between two threads: the report is the one that running
    them one after another in a single thread gives, to the byte."""
    import lmprof.trace.analyze as analyze_mod

    path = DATA / f"{name}.json.gz"
    threaded = repr(analyze_table(load_trace(path)))
    monkeypatch.setattr(analyze_mod, "ThreadPoolExecutor", _InOrder)
    in_order = repr(analyze_table(load_trace(path)))
    assert threaded == in_order


@pytest.mark.parametrize("where", ["annotation_breakdown", "kernel_breakdown", "critical_path"])
def test_an_analysis_that_fails_in_either_thread_fails_the_call_and_nothing_hangs(where, monkeypatch):
    """A failing analysis (in the second thread, or in the first with host analyses still queued)
    reaches the caller as itself, and analyze_table returns instead of waiting on the queue."""
    import lmprof.trace.analyze as analyze_mod

    def boom(*args, **kwargs):
        raise DataError(f"{where} failed")

    monkeypatch.setattr(analyze_mod, where, boom)
    with pytest.raises(DataError, match=f"{where} failed"):
        analyze_table(load_trace(DATA / "v100_train_rank0.json.gz"))


def test_result_records_are_frozen_and_become_plain_dicts():
    """The analyses' results (msgspec Structs since their dataclasses cost 38 ms of start-up) stay
    immutable, and as_dict turns a nested report into dicts and lists all the way down."""
    from lmprof.trace.records import as_dict

    report = analyze_table(load_trace(DATA / "v100_train_rank0.json.gz"))
    with pytest.raises(AttributeError):
        report.events = 0  # type: ignore[misc]
    plain = as_dict(report)
    assert plain["events"] == report.events and plain["device"]["window"]["start_us"] == report.device.window.start_us

    def only_plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and only_plain(v) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return all(only_plain(v) for v in x)
        return x is None or isinstance(x, (str, int, float, bool, np.integer, np.floating))

    assert only_plain(plain)
    assert json.loads(json.dumps(json_ready(plain)))["operators"] == json_ready(plain)["operators"]


def test_as_dict_recurses_like_dataclasses_asdict():
    """Records, dataclasses (the multi-rank results), lists, tuples, namedtuples and dicts, nested."""
    import dataclasses
    from collections import namedtuple

    from lmprof.trace.records import Record, as_dict

    Pair = namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Old:
        v: list

    class New(Record, frozen=True):
        x: int
        items: list
        more: dict

    obj = New(1, [Pair(2, New(3, [], {})), (4, Old([5]))], {"k": Old([])})
    assert as_dict(obj) == {"x": 1, "items": [Pair(2, {"x": 3, "items": [], "more": {}}), (4, {"v": [5]})],
                            "more": {"k": {"v": []}}}
    assert type(as_dict(obj)["items"][0]) is Pair
