"""Trace analyses on small traces written event by event, with the right answers worked out by hand."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmprof.trace import autograd, kinds, nesting
from lmprof.trace.analyze import analyze_table, analyze_tables
from lmprof.trace.kernels import kernel_breakdown, operator_breakdown
from lmprof.trace.launches import kernel_launches, launch_stats
from lmprof.trace.load import load_trace
from lmprof.trace.timeline import idle_causes, select_device, temporal_breakdown

T0 = 1_000_000.0  # a realistic non-zero clock; all times below are offsets in us
HOST_PID, HOST_TID, BWD_TID = 100, 100, 101


class Trace:
    """Builds a Kineto-like trace dict one event at a time."""

    def __init__(self, rank: int | None = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.rank = rank
        self._corr = 1000

    def host(
        self,
        name: str,
        ts: float,
        dur: float,
        cat: str = "cpu_op",
        tid: int = HOST_TID,
        seq: int | None = None,
        **args: Any,
    ) -> None:
        if seq is not None:
            args["Sequence number"] = seq
        event = {"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": tid, "ts": T0 + ts, "dur": dur}
        self.events.append({**event, "args": args})

    def step(self, n: int, ts: float, dur: float) -> None:
        self.host(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: float, dur: float, tid: int = HOST_TID, corr: int | None = None) -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.host(name, ts, dur, cat="cuda_runtime", tid=tid, correlation=corr, **{"External id": corr})
        return corr

    def device(
        self, name: str, ts: float, dur: float, stream: int = 7, corr: int = -1, cat: str = "kernel"
    ) -> None:
        args = {"device": 0, "stream": stream, "correlation": corr}
        event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur}
        self.events.append({**event, "args": args})

    def kernel(
        self,
        name: str,
        ts: float,
        dur: float,
        stream: int = 7,
        launch: tuple[float, float] | None = None,
        api: str = "cudaLaunchKernel",
        cat: str = "kernel",
        tid: int = HOST_TID,
    ) -> None:
        """A device event and, when ``launch`` = (start, duration) is given, its runtime call."""
        corr = -1
        if launch is not None:
            corr = self.runtime(api, launch[0], launch[1], tid=tid)
        self.device(name, ts, dur, stream=stream, corr=corr, cat=cat)

    def write(self, folder: Path, name: str = "trace.json", gz: bool = False) -> Path:
        doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": 2}
        path = folder / (name + (".gz" if gz else ""))
        data = json.dumps(doc).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


def _load(tr: Trace, tmp_path: Path):
    return load_trace(tr.write(tmp_path))


# ------------------------------------------------------------------------------------ temporal


def test_two_streams_overlapping_count_once(tmp_path):
    tr = Trace()
    tr.kernel("gemm_a", 0, 10, stream=7, launch=(-20, 5))
    tr.kernel("gemm_b", 7, 10, stream=8, launch=(-10, 5))  # overlaps gemm_a by 3 us
    t = _load(tr, tmp_path)
    sel = select_device(t)
    temporal, overlap = temporal_breakdown(t, sel)
    assert sel.window.span_us == pytest.approx(17.0)
    assert temporal.compute_us == pytest.approx(17.0)  # union 10 + 10 - 3
    assert temporal.idle_us == pytest.approx(0.0)
    assert temporal.busy_us == pytest.approx(17.0)
    assert overlap.overlap_pct is None  # no communication
    assert kernel_breakdown(t, sel.rows).total_us == pytest.approx(20.0)  # summed, not union


def test_compute_communication_memory_idle(tmp_path):
    tr = Trace()
    tr.kernel("elementwise_kernel", 0, 10, stream=7, launch=(-30, 2))
    tr.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 5, 15, stream=20, launch=(-25, 2))  # 5..20
    tr.kernel("Memcpy HtoD (Pageable -> Device)", 25, 5, stream=7, launch=(-20, 2), api="cudaMemcpyAsync",
              cat="gpu_memcpy")  # fmt: skip
    t = _load(tr, tmp_path)
    sel = select_device(t)
    temporal, overlap = temporal_breakdown(t, sel)
    # window 0..30; compute 0..10; communication alone 10..20; memory 25..30; idle 20..25
    assert temporal.span_us == pytest.approx(30.0)
    assert temporal.compute_us == pytest.approx(10.0)
    assert temporal.communication_us == pytest.approx(10.0)
    assert temporal.memory_us == pytest.approx(5.0)
    assert temporal.idle_us == pytest.approx(5.0)
    assert temporal.non_compute_us == pytest.approx(15.0)
    pcts = (temporal.compute_pct, temporal.communication_pct, temporal.memory_pct, temporal.idle_pct)
    assert sum(pcts) == pytest.approx(100.0)
    assert temporal.regions_us == pytest.approx(
        {"computation": 5.0, "computation+communication": 5.0, "communication": 10.0, "memory": 5.0}
    )
    # HTA overlap: compute while communicating / communication time = 5 / 15
    assert overlap.communication_total_us == pytest.approx(15.0)
    assert overlap.overlapped_us == pytest.approx(5.0)
    assert overlap.overlap_pct == pytest.approx(100.0 / 3)


def test_rccl_kernel_is_communication(tmp_path):
    tr = Trace()
    tr.kernel("void rccl::ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", 0, 8,
              launch=(-10, 2), api="hipExtLaunchKernel")  # fmt: skip
    t = _load(tr, tmp_path)
    temporal, _ = temporal_breakdown(t, select_device(t))
    assert temporal.communication_us == pytest.approx(8.0)
    assert temporal.compute_us == 0.0


# ---------------------------------------------------------------------------------- idle causes


def test_idle_causes_sync_host_bound_other(tmp_path):
    tr = Trace()
    tr.kernel("k1", 0, 10, launch=(-20, 5))
    # gap 10..20: k2 was enqueued at -10..-5, before the device went idle -> other
    tr.kernel("k2", 20, 10, launch=(-10, 5))
    # gap 30..40: k3's launch starts at 32, after k2 ended at 30 -> host-bound
    tr.kernel("k3", 40, 10, launch=(32, 5))
    # gap 50..70: a cudaStreamSynchronize (e.g. .item()) runs 52..60 -> sync
    tr.runtime("cudaStreamSynchronize", 52, 8)
    tr.kernel("k4", 70, 5, launch=(65, 3))
    # gap 75..80: k5's launch call started at 74 but returned at 79.5, after the device ran dry -> host-bound
    tr.kernel("k5", 80, 2, launch=(74, 5.5))
    t = _load(tr, tmp_path)
    sel = select_device(t)
    idle = idle_causes(t, sel)
    temporal, _ = temporal_breakdown(t, sel)
    assert idle.gaps == 4
    assert idle.other_us == pytest.approx(10.0)
    assert idle.host_bound_us == pytest.approx(15.0)
    assert idle.sync_us == pytest.approx(20.0)
    assert (idle.sync_gaps, idle.host_bound_gaps, idle.other_gaps) == (1, 2, 1)
    assert idle.idle_us == pytest.approx(45.0) == pytest.approx(temporal.idle_us)
    assert idle.largest_gap_us == pytest.approx(20.0)


def test_sync_on_another_thread_and_blocking_memcpy(tmp_path):
    tr = Trace()
    tr.kernel("k1", 0, 10, launch=(-20, 5))
    tr.runtime("cudaMemcpy", 11, 4, tid=999)  # blocking copy on another host thread, inside the gap
    tr.kernel("k2", 30, 10, launch=(25, 2))
    t = _load(tr, tmp_path)
    idle = idle_causes(t, select_device(t))
    assert idle.sync_us == pytest.approx(20.0)
    assert idle.host_bound_us == 0.0


def test_unlinked_kernel_after_gap_is_other(tmp_path):
    tr = Trace()
    tr.kernel("k1", 0, 10, launch=(-20, 5))
    tr.kernel("k2", 15, 5)  # no runtime call in the trace
    t = _load(tr, tmp_path)
    idle = idle_causes(t, select_device(t))
    assert idle.other_us == pytest.approx(5.0)


def test_sync_call_names():
    blocking = (
        "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
        "hipDeviceSynchronize", "hipMemcpyWithStream", "cuStreamSynchronize", "cuMemcpyDtoH_v2",
    )  # fmt: skip
    for name in blocking:
        assert kinds.is_sync_call(name), name
    for name in ("cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent", "hipMemcpyAsync"):
        assert not kinds.is_sync_call(name), name


# ------------------------------------------------------------------------------ window (steps)


def test_last_profiler_step_left_out_like_hta(tmp_path):
    tr = Trace()
    tr.step(1, 0, 50)
    tr.step(2, 50, 50)
    tr.kernel("a", 20, 10, launch=(10, 2))  # launched in step 1
    tr.kernel("b", 70, 10, launch=(60, 2))  # launched in step 2, the last
    tr.kernel("orphan", 35, 1)  # no runtime call: HTA drops it once steps filter
    t = _load(tr, tmp_path)
    sel = select_device(t)
    assert sel.window.rule == "before last ProfilerStep"
    assert (sel.window.device_events, sel.window.excluded_events) == (1, 2)
    assert sel.window.span_us == pytest.approx(10.0)
    sel_all = select_device(t, include_last_step=True)
    assert sel_all.window.device_events == 2
    temporal, _ = temporal_breakdown(t, sel_all)
    assert temporal.span_us == pytest.approx(60.0)  # 20..80
    assert temporal.idle_us == pytest.approx(40.0)


def test_steps_but_no_runtime_calls_keeps_everything(tmp_path):
    tr = Trace()
    tr.step(1, 0, 50)
    tr.step(2, 50, 50)
    tr.kernel("a", 20, 10)
    tr.kernel("b", 70, 10)
    t = _load(tr, tmp_path)
    sel = select_device(t)
    assert sel.window.device_events == 2 and sel.window.rule.startswith("all device events (none")


def test_single_step_keeps_what_the_trace_launched(tmp_path):
    """One step is the trace's work; a device event whose launch is not in the trace was queued before the
    profiler recorded (a previous step's tail) and is left out, as HTA leaves it out with more steps."""
    tr = Trace()
    tr.step(7, 0, 100)
    tr.kernel("orphan", 5, 5)
    tr.kernel("a", 20, 10, launch=(10, 2))
    t = _load(tr, tmp_path)
    sel = select_device(t)
    assert sel.window.rule == "launched in the trace (one ProfilerStep)"
    assert (sel.window.device_events, sel.window.excluded_events) == (1, 1)
    assert sel.window.span_us == 10  # a alone (the builder offsets the clock)


def test_single_step_without_runtime_calls_keeps_everything(tmp_path):
    tr = Trace()
    tr.step(7, 0, 100)
    tr.kernel("a", 20, 10)
    tr.kernel("b", 40, 5)
    sel = select_device(_load(tr, tmp_path))
    assert sel.window.device_events == 2 and sel.window.rule.startswith("all device events (none")


def test_step_stats(tmp_path):
    tr = Trace()
    for i, d in enumerate([10_000, 20_000, 30_000, 40_000, 50_000]):
        tr.step(i + 1, i * 60_000, d)
    tr.host("gpu copy of a step", 0, 5, cat="gpu_user_annotation")
    rep = analyze_table(_load(tr, tmp_path))
    st = rep.steps
    assert st.count == 5
    assert st.median_ms == pytest.approx(30.0)
    assert st.p10_ms == pytest.approx(14.0)  # linear interpolation, numpy's default
    assert st.p90_ms == pytest.approx(46.0)
    assert [s.step for s in st.steps] == [1, 2, 3, 4, 5]
    assert st.steps[1].start_us == pytest.approx(60_000.0)


# ------------------------------------------------------------------------------------ launches


def test_launch_delay_and_short_kernels(tmp_path):
    tr = Trace()
    tr.kernel("k1", 10, 10, launch=(2, 5))  # delay 8, 10 >= 5
    tr.kernel("k2", 20, 1, launch=(15, 3))  # delay 5, shorter than its launch (1 < 3)
    tr.kernel("k3", 50, 2, launch=(40, 20))  # delay 10, shorter (2 < 20)
    tr.kernel("m", 60, 1, launch=(55, 3), api="cudaMemsetAsync", cat="gpu_memset")  # not a kernel
    t = _load(tr, tmp_path)
    sel = select_device(t)
    st = launch_stats(t, sel.rows)
    assert (st.kernels, st.linked) == (3, 3)
    assert st.launch_delay_median_us == pytest.approx(8.0)
    assert st.launch_delay_p90_us == pytest.approx(9.6)
    assert st.launch_delay_max_us == pytest.approx(10.0)
    assert st.short_kernels == 2
    assert st.short_kernels_pct == pytest.approx(200.0 / 3)
    assert st.short_kernels_time_us == pytest.approx(3.0)
    assert st.launch_call_median_us == pytest.approx(5.0)


def test_kernel_links_to_runtime_op_and_annotation(tmp_path):
    tr = Trace()
    tr.step(1, -10, 200)
    tr.host("lmprof:mlp.fc", 0, 40, cat="user_annotation")
    tr.host("aten::linear", 1, 30)
    tr.host("aten::addmm", 2, 20)
    tr.kernel("gemm", 50, 10, launch=(5, 3))
    tr.kernel("orphan", 70, 1)
    t = _load(tr, tmp_path)
    ev = t.events
    links = kernel_launches(t)
    names = ev["name"].astype(str).to_numpy()
    row = int(np.flatnonzero(names == "gemm")[0])
    rt = links.at[row, "runtime"]
    assert names[rt] == "cudaLaunchKernel"
    assert names[links.at[row, "op"]] == "aten::addmm"
    assert names[links.at[row, "annotation"]] == "lmprof:mlp.fc"
    assert links.at[row, "launch_delay_us"] == pytest.approx(45.0)
    orphan = int(np.flatnonzero(names == "orphan")[0])
    assert links.at[orphan, "runtime"] == -1 and links.at[orphan, "op"] == -1
    assert np.isnan(links.at[orphan, "launch_delay_us"])
    # any enclosing scope, by mask: the step around the block
    steps = kinds.name_mask(t, lambda n: n.startswith("ProfilerStep"))
    assert names[nesting.enclosing(t, np.array([rt]), steps)[0]] == "ProfilerStep#1"
    lm = kinds.name_mask(t, lambda n: n.startswith("lmprof:"))
    assert names[nesting.enclosing(t, np.array([rt]), lm)[0]] == "lmprof:mlp.fc"


def test_driver_and_runtime_share_correlation(tmp_path):
    tr = Trace()
    corr = tr.runtime("cudaLaunchKernel", 0, 10)
    tr.host("cuLaunchKernel", 2, 5, cat="cuda_driver", correlation=corr)
    tr.device("k", 20, 3, corr=corr)
    t = _load(tr, tmp_path)
    links = kernel_launches(t)
    names = t.events["name"].astype(str).to_numpy()
    assert names[links["runtime"].iloc[0]] == "cudaLaunchKernel"


def test_backward_kernel_maps_to_forward_op(tmp_path):
    tr = Trace()
    tr.host("lmprof:ln_1", 0, 20, cat="user_annotation")
    tr.host("aten::add_", 1, 1, seq=5)  # records the number the next node takes, but creates none
    tr.host("aten::batch_norm", 3, 10, seq=5)
    tr.host("aten::cudnn_batch_norm", 4, 8, seq=5)
    tr.host("aten::empty", 5, 1, seq=6)  # after the node was created: next number
    tr.host("autograd::engine::evaluate_function: CudnnBatchNormBackward0", 100, 20, tid=BWD_TID, seq=5)
    tr.host("CudnnBatchNormBackward0", 101, 18, tid=BWD_TID, seq=5)
    tr.kernel("bn_bw_kernel", 130, 5, launch=(105, 3), tid=BWD_TID)
    t = _load(tr, tmp_path)
    names = t.events["name"].astype(str).to_numpy()
    links = kernel_launches(t)
    rt = links["runtime"].to_numpy()
    bw = nesting.enclosing(t, rt, autograd.backward_node_mask(t))
    assert names[bw[0]].endswith("CudnnBatchNormBackward0")
    fw = autograd.forward_op(t, bw)
    assert names[fw[0]] == "aten::cudnn_batch_norm"
    lm = kinds.name_mask(t, lambda n: n.startswith("lmprof:"))
    assert names[nesting.enclosing(t, fw, lm)[0]] == "lmprof:ln_1"


# ------------------------------------------------------------------------- nesting & operators


def test_self_time_and_partial_overlap(tmp_path):
    tr = Trace()
    tr.host("A", 0, 100)
    tr.host("B", 10, 20)
    tr.host("C", 40, 10)
    tr.host("D", 41, 4)
    tr.host("E", 200, 10)
    tr.host("F", 205, 15)  # starts inside E but ends after it: not a child
    tr.host("G", 300, 10, tid=555)  # another thread, same time range as nothing: a root
    t = _load(tr, tmp_path)
    names = t.events["name"].astype(str).to_numpy()
    by = {n: i for i, n in enumerate(names)}
    par = nesting.parents(t)
    assert par[by["B"]] == by["A"] and par[by["C"]] == by["A"] and par[by["D"]] == by["C"]
    assert par[by["A"]] == -1 and par[by["F"]] == -1 and par[by["G"]] == -1
    st = nesting.self_time(t)
    assert st[by["A"]] == pytest.approx(70.0)
    assert st[by["C"]] == pytest.approx(6.0)
    assert st[by["E"]] == pytest.approx(10.0)
    ops = operator_breakdown(t, top=3)
    assert [r.name for r in ops.top] == ["A", "B", "F"]
    assert ops.top[0].self_us == pytest.approx(70.0)
    assert ops.top[0].total_us == pytest.approx(100.0)
    assert ops.self_us == pytest.approx(70 + 20 + 6 + 4 + 10 + 15 + 10)


def test_nested_ops_same_start_and_zero_duration(tmp_path):
    tr = Trace()
    tr.host("outer", 0, 10)
    tr.host("inner", 0, 4)  # same start: the longer one is the parent
    tr.host("marker", 10, 0)  # zero-length at the parent's end: a sibling
    t = _load(tr, tmp_path)
    names = t.events["name"].astype(str).to_numpy()
    by = {n: i for i, n in enumerate(names)}
    par = nesting.parents(t)
    assert par[by["inner"]] == by["outer"]
    assert par[by["marker"]] == -1


def test_kernel_breakdown_top(tmp_path):
    tr = Trace()
    for i in range(3):
        tr.kernel("gemm", 100 * i, 10, launch=(100 * i - 20, 2))
    tr.kernel("relu", 50, 4, launch=(40, 2))
    tr.kernel("ncclKernel_AllReduce", 60, 6, stream=9, launch=(41, 2))
    t = _load(tr, tmp_path)
    kb = kernel_breakdown(t, select_device(t).rows, top=2)
    assert kb.count == 5 and kb.total_us == pytest.approx(40.0)
    top = [(r.name, r.count, r.type) for r in kb.top]
    assert top == [("gemm", 3, "computation"), ("ncclKernel_AllReduce", 1, "communication")]
    assert kb.top[0].share_pct == pytest.approx(75.0)
    assert kb.top[0].mean_us == pytest.approx(10.0)
    assert kb.by_type_us == pytest.approx({"computation": 34.0, "communication": 6.0, "memory": 0.0})


# ------------------------------------------------------------------------------- whole reports


def test_cpu_only_trace_has_no_device_section(tmp_path):
    tr = Trace(rank=34)
    tr.host("aten::mm", 0, 10)
    rep = analyze_table(_load(tr, tmp_path))
    assert rep.device is None
    assert rep.device_note == "no device activity in trace"
    assert rep.rank == 34
    assert rep.operators.top[0].name == "aten::mm"


def test_ranks_slowest_and_communication_skew(tmp_path):
    tables = []
    for rank, step_us, comm_us in ((0, 10_000, 300), (1, 12_000, 100), (2, 11_000, 200)):
        tr = Trace(rank=rank)
        for i in range(3):
            tr.step(i + 1, i * 20_000, step_us)
            tr.kernel("gemm", i * 20_000 + 10, 100, launch=(i * 20_000 + 1, 2))
            tr.kernel("ncclKernel_AllReduce", i * 20_000 + 200, comm_us, stream=9, launch=(i * 20_000 + 2, 2))
        folder = tmp_path / f"r{rank}"
        folder.mkdir()
        tables.append(load_trace(tr.write(folder)))
    rep = analyze_tables(tables[::-1])
    rc = rep.ranks
    assert [r.rank for r in rc.ranks] == [0, 1, 2]
    assert rc.measure == "step_ms"
    assert (rc.slowest_rank, rc.fastest_rank) == (1, 0)
    assert rc.slowest_over_fastest_pct == pytest.approx(20.0)
    assert rc.slowest_over_median_pct == pytest.approx(100.0 / 11)
    # last step left out: two steps of communication per rank
    assert (rc.communication_min_us, rc.communication_max_us) == (pytest.approx(200.0), pytest.approx(600.0))
    assert rc.communication_skew_us == pytest.approx(400.0)
    assert rc.communication_skew_pct == pytest.approx(100.0)


def test_duplicate_ranks_are_an_error(tmp_path):
    from lmprof.errors import DataError

    tr = Trace(rank=3)
    tr.host("aten::mm", 0, 10)
    t = _load(tr, tmp_path)
    with pytest.raises(DataError, match="rank 3"):
        analyze_tables([t, t])
