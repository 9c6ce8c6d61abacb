"""The vectorised helpers behind the analysis speed of issue 19, each against an independent answer:
hand-worked cases, and numpy's own lexsort for the host-event order."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lmprof.trace import kinds
from lmprof.trace.analyze import analyze_table
from lmprof.trace.critical import _CROSS, _LAUNCH, _STREAM, _UNKNOWN, _waits
from lmprof.trace.launches import kernel_launches, launch_columns
from lmprof.trace.load import load_trace
from lmprof.trace import nesting
from lmprof.trace.nesting import _END_SLACK_US, _jump_parents, sorted_parents, thread_order
from test_trace_synthetic import T0, Trace

INF = np.inf


def test_thread_order_by_hand():
    # rows: 0 (1,5) ts 3; 1 (1,5) ts 1 dur 2; 2 (0,9) ts 7; 3 (1,5) ts 1 dur 4; 4 (1,2) ts 8; 5 (1,5) ts 1 dur 4
    pid = np.array([1, 1, 0, 1, 1, 1])
    tid = np.array([5, 5, 9, 5, 2, 5])
    ts = np.array([3.0, 1.0, 7.0, 1.0, 8.0, 1.0])
    neg_dur = -np.array([1.0, 2.0, 1.0, 4.0, 1.0, 4.0])
    # thread (0,9): 2; thread (1,2): 4; thread (1,5): ts 1 longest first (3 and 5 tie: row order), then 1, then 0
    assert thread_order(pid, tid, ts, neg_dur).tolist() == [2, 4, 3, 5, 1, 0]


@pytest.mark.parametrize("seed", range(5))
def test_thread_order_is_the_four_key_lexsort(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    pid = rng.choice([3, -1, 70000], n)
    tid = rng.choice([0, 2**40, -5, 17], n)
    if seed == 4:  # more (pid, tid) pairs than a 16-bit thread number holds
        pid, tid = rng.integers(0, 300, n), rng.integers(0, 300, n)
    ts = np.round(rng.uniform(0, 300, n))  # coarse: many equal starts
    if seed % 2:
        ts.sort()  # the usual case: the trace in time order
    neg_dur = -np.round(rng.uniform(0, 4, n)) * (rng.random(n) < 0.8)  # ties, zeros (and -0.0)
    want = np.lexsort((neg_dur, ts, tid, pid))
    assert np.array_equal(thread_order(pid, tid, ts, neg_dur), want)
    assert thread_order(pid[:0], tid[:0], ts[:0], neg_dur[:0]).size == 0


def test_waits_by_hand():
    # device events by end; (stream, start, end, launching call's end or None)
    events = [
        ("A", 0.0, 10.0, -2.0),  # 0: launched at -2, nothing before it: the launch
        ("B", 12.0, 20.0, 5.0),  # 1: stream and launch free well before 12; event 0 ended at 10: cross
        ("A", 20.5, 30.0, 3.0),  # 2: own stream free at 10, launch at 3, event 1 ended at 20: cross to 1
        ("A", 30.0, 40.0, None),  # 3: queued behind event 2 (ended at its start)
        ("B", 41.0, 45.0, 40.5),  # 4: launch ended 0.5 us before start (within _EPS): the launch
        ("C", 2.0, 46.0, None),  # 5: nothing had ended at 2 and no launch: unknown
        ("C", 50.0, 50.0000005, None),  # 6: behind 5 on stream C; it ends within 1e-6 of its start, yet
        # is not taken for its own predecessor (5 ended at 46, no later than stream C was free)
    ]
    start = np.array([e[1] for e in events])
    end = np.array([e[2] for e in events])
    lane = np.array([ord(e[0]) for e in events])
    launched = np.array([e[3] is not None for e in events])
    call_end = np.array([-INF if e[3] is None else e[3] for e in events])
    kind, nxt, nxt_end = _waits(start, end, np.zeros(len(events), dtype=np.int64), lane, call_end, launched)
    assert kind.tolist() == [_LAUNCH, _CROSS, _CROSS, _STREAM, _LAUNCH, _UNKNOWN, _STREAM]
    assert nxt.tolist() == [-1, 0, 1, 2, -1, -1, 5]
    assert nxt_end.tolist() == [-INF, 10.0, 20.0, 30.0, -INF, -INF, 46.0]
    # the same streams in another process (pid) are other streams: event 3 then waits on nothing of its own
    other = np.array([0, 0, 0, 1, 0, 0, 0])
    kind, nxt, _ = _waits(start, end, other, lane, call_end, launched)
    assert kind[3] == _CROSS and nxt[3] == 2  # 2 ended at 30 on another stream: a cross-stream wait
    empty = _waits(start[:0], end[:0], other[:0], lane[:0], call_end[:0], launched[:0])
    assert [a.size for a in empty] == [0, 0, 0]


def test_launch_intervals_per_exact_thread(tmp_path):
    # (pid 99, tid 2**20 + 100) and the step's thread (100, 100) share the number pid * 2**20 + tid;
    # each thread's host time must count only its own launch calls
    tr = Trace()
    tr.step(1, 0, 100)
    tr.runtime("cudaLaunchKernel", 10, 20)
    tr.events[-1]["pid"], tr.events[-1]["tid"] = 99, 2**20 + 100
    tr.runtime("cudaLaunchKernel", 50, 10)  # on the step's thread
    seg = analyze_table(load_trace(tr.write(tmp_path))).critical_path.steps[0].segments_us
    assert seg["launch_call"] == 10 and seg["cpu"] == 90


def _copy(tr: Trace, name: str, ts: float, dur: float, cat: str = "gpu_memcpy", **args) -> None:
    tr.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": T0 + ts, "dur": dur,
                      "args": {"device": 0, "stream": 7, **args}})  # fmt: skip


def test_copy_kinds_grouped_once_per_kind(tmp_path):
    tr = Trace()
    _copy(tr, "Memset (Device)", 0, 30, cat="gpu_memset", bytes=3_000)
    _copy(tr, "Memcpy DtoH (Device -> Pinned)", 30, 10, bytes=1_000)
    _copy(tr, "  Memcpy DtoH (Device -> Pinned)  ", 40, 20, bytes=2_000)  # same kind once stripped
    _copy(tr, "Memcpy DtoH (Device -> Pinned)", 60, 5)  # no args.bytes: not counted
    _copy(tr, "Memcpy HtoD", 70, 40, bytes=8_000)
    hw = analyze_table(load_trace(tr.write(tmp_path))).device.hardware
    # by time, longest first; the memset and the DtoH copies tie at 30 us: first seen first
    assert [(c.kind, c.count, c.bytes, c.time_us) for c in hw.copies] == [
        ("Memcpy HtoD", 1, 8_000, 40.0),
        ("Memset (Device)", 1, 3_000, 30.0),
        ("Memcpy DtoH (Device -> Pinned)", 2, 3_000, 30.0),
    ]
    assert hw.copies[0].achieved_gbps == pytest.approx(8_000 / 40e-6 / 1e9)


def test_masks_are_built_once_and_read_only(tmp_path):
    tr = Trace()
    tr.kernel("k", 10, 5, launch=(0, 3))
    t = load_trace(tr.write(tmp_path))
    for mask in (kinds.device_mask, kinds.kernel_mask, kinds.runtime_mask, kinds.op_mask, kinds.annotation_mask,
                 kinds.host_mask, kinds.sync_mask):  # fmt: skip
        m = mask(t)
        assert mask(t) is m
        with pytest.raises(ValueError):
            m[0] = not m[0]
    assert kinds.kernel_mask(t).tolist() == [False, True] and kinds.runtime_mask(t).tolist() == [True, False]


def test_long_chain_of_queued_kernels_adds_up_in_walk_order(tmp_path):
    # 40 kernels queued on one stream (more than critical._SHORT_RUN, so the chain is summed by numpy),
    # all launched early in the step. Times near 0 and uneven, so that the order of the additions
    # shows in the last bits (with epoch-sized timestamps every difference is exact).
    rng = random.Random(8)
    tr = Trace()
    tr.step(1, 0, 5)
    cur = 10.0
    for i in range(40):
        dur = rng.uniform(0.1, 3)
        tr.kernel(f"k{i % 3}", cur, dur, launch=(0.1 * i, 0.05))
        cur += dur + rng.uniform(0.05, 0.9)  # under _EPS: each kernel waits for the one before
    for e in tr.events:
        e["ts"] -= T0
    t = load_trace(tr.write(tmp_path))
    cp = analyze_table(t).critical_path
    seg = cp.steps[0].segments_us
    ev = t.events
    k = ev[ev["cat"] == "kernel"].sort_values("ts")
    start, end = k["ts"].to_numpy().tolist(), (k["ts"] + k["dur"]).to_numpy().tolist()
    # the walk's own definition, step by step from the last kernel back: kernel time, then the gap
    busy = wait = 0.0
    for i in range(39, -1, -1):
        busy += end[i] - start[i]
        if i:
            wait += start[i] - end[i - 1]
    assert busy != float(np.sum(np.subtract(end, start)[::-1]))  # pairwise summation would differ here
    assert seg["computation"] == busy and seg["device_wait"] == wait  # to the last bit
    assert seg["launch_latency"] == pytest.approx(10 - 0.05) and seg["launch_call"] == pytest.approx(0.05)
    assert cp.steps[0].kernels_on_path == 40 and cp.steps[0].step_us == pytest.approx(end[-1])
    assert sum(seg.values()) == pytest.approx(cp.steps[0].step_us)


@pytest.mark.parametrize("seed", range(40))
def test_jump_parents_is_the_nearest_open_enclosing_event(seed):
    # the definition, event by event: the nearest earlier event of the same thread that is open when
    # the event starts and does not end before it (partial overlaps, ties and zero lengths included)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    thread = rng.integers(0, 3, n)
    start = np.round(rng.uniform(0, 50, n))
    dur = np.round(rng.uniform(0, 20, n)) * (rng.random(n) < 0.9)
    o = np.lexsort((-dur, start, thread))
    start, end, thread = start[o], start[o] + dur[o], thread[o]
    want = np.full(n, -1)
    for i in range(n):
        for c in range(i - 1, -1, -1):
            if thread[c] != thread[i]:
                break
            if end[c] > start[i] and end[c] + _END_SLACK_US >= end[i]:
                want[i] = c
                break
    rows = np.arange(100, 100 + n)  # positions come back as these rows
    assert _jump_parents(start, end, thread, rows).tolist() == np.where(want >= 0, rows[want], -1).tolist()
    # the compiled walk (when built) gives the same parents, and so does its fallback when its budget runs out
    assert sorted_parents(start, end, thread, rows, native=True).tolist() == np.where(want >= 0, rows[want], -1).tolist()


@pytest.mark.skipif(nesting._nest is None, reason="the compiled nesting walk is not built (no compiler at install)")
def test_compiled_walk_gives_up_past_its_budget_and_numpy_takes_over(monkeypatch):
    # 2000 events, each starting inside and ending after the one before (partial overlaps): no
    # parents, each found in one step (to the predecessor's parent, none); half a step each stops it
    n = 2000
    start = np.arange(n, dtype=np.float64)
    end = start + 1.5
    thread = np.zeros(n, dtype=np.int32)
    out = np.empty(n, dtype=np.int64)
    assert not nesting._nest.parents(start, end, thread, _END_SLACK_US, n // 2, out)
    assert nesting._nest.parents(start, end, thread, _END_SLACK_US, 10 * n, out) and (out == -1).all()
    monkeypatch.setattr(nesting, "_NATIVE_STEPS_PER_EVENT", 0)  # the budget is then 1024 steps
    rows = np.arange(n)
    assert (sorted_parents(start, end, thread, rows, native=True) == -1).all()


def test_launch_columns_are_the_frame_rows(tmp_path):
    tr = Trace()
    tr.kernel("a", 10, 5, launch=(0, 3))
    tr.kernel("b", 20, 5)  # no launching call in the trace
    tr.kernel("c", 30, 5, launch=(12, 4))
    t = load_trace(tr.write(tmp_path))
    links = kernel_launches(t)
    rows = links.index.to_numpy()[[2, 0, 1, 2]]  # c, a, b, c: any order, repeats allowed
    got = launch_columns(t, rows, ["runtime", "launch_delay_us"])
    assert got["runtime"].tolist() == links.loc[rows, "runtime"].tolist()
    np.testing.assert_array_equal(got["launch_delay_us"], links.loc[rows, "launch_delay_us"].to_numpy())
    assert np.isnan(got["launch_delay_us"][2]) and got["launch_delay_us"][1] == 10  # b unlinked; a: 10 - 0
    assert launch_columns(t, rows[:0], ["runtime"])["runtime"].size == 0
    with pytest.raises(KeyError):
        launch_columns(t, np.array([rows[0], int(links["runtime"].max())]), ["runtime"])  # a runtime call row
