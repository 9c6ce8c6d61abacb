"""Attribute each profiled step's time to blocks, forward and backward, from a trace table.

How a trace event becomes a block's time:

* **Owners** are the intervals that can own time: lmprof's ``lmprof:<name>`` ranges (block scopes and
  step parts), the ``ProfilerStep#N`` range, and in the backward pass every autograd node evaluation
  (``autograd::engine::evaluate_function: XBackward0``).
* A backward node belongs to the block whose forward op created it: forward ops carry an autograd
  ``Sequence number`` and the node evaluating their gradient carries the same number. AccumulateGrad
  (writing .grad of parameters) has no forward op and gets its own row, ``accumulate_grad``.
* **CPU clock** (CPU runs): an owner's time is its exclusive wall time, its duration minus that of
  the owners nested in it. Exclusive times of all owners in a step add up to the step exactly; what
  no block claims shows as ``other`` in its phase, never hidden.
* **Device clock** (GPU traces): an owner's time is the summed duration of the kernels, copies and
  sets launched from inside it (runtime call -> kernel by correlation id). The step's remainder,
  wall time with no kernel attributed, is ``idle`` (device waiting for the host or for syncs).

The result is per step (mean over the profiled steps), so parts add up to the mean profiled step.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from lmprof.trace.load import TraceTable
from lmprof.workloads.blocks import SCOPE_PREFIX

EVAL_PREFIX = "autograd::engine::evaluate_function: "
# Scopes that enclose blocks: their exclusive time is that phase's ``other``.
PHASE_SCOPES = ("forward", "backward", "prefill", "decode")
# Scopes that are step parts on their own.
LEAF_PARTS = ("data", "optimizer", "zero_grad")
# Host-side collective calls, DDP's gradient-bucket work and FSDP's gather/reduce ranges: their own
# blocks ("allreduce" for gradient reduction, "allgather" for FSDP's parameter gathers, "comm" else).
COMM_PREFIXES = ("c10d::", "torch.distributed.ddp.reducer::", "torch::distributed::reducer::", "FSDP::")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "runtime")

Clock = Literal["cpu", "device"]


@dataclass
class Part:
    """Mean time per step of one (name, phase), microseconds; calls per step."""

    name: str
    phase: str
    us: float
    calls: float


@dataclass
class Attribution:
    steps: int
    step_us: list[float]
    parts: list[Part]
    clock: Clock
    notes: list[str] = field(default_factory=list)

    @property
    def mean_step_us(self) -> float:
        return float(np.mean(self.step_us)) if self.step_us else 0.0

    def total_us(self) -> float:
        return sum(p.us for p in self.parts)

    def by_phase(self, phase: str) -> dict[str, float]:
        return {p.name: p.us for p in self.parts if p.phase == phase}


@dataclass
class _Owner:
    tid: int  # the thread it nests on (backward nodes: the thread that called backward)
    ts: float
    end: float
    name: str
    phase: str
    exclusive: float = 0.0
    device: float = 0.0
    launch_tid: int | None = None  # the thread its kernels are launched from, when not ``tid``

    @property
    def own_tid(self) -> int:
        return self.tid if self.launch_tid is None else self.launch_tid


def comm_label(name: str) -> str:
    """The block a communication event belongs to."""
    low = name.lower()
    if "all_gather" in low or "allgather" in low:
        return "allgather"
    if "allreduce" in low or "reducer" in low or "reduce" in low:
        return "allreduce"
    return "comm"  # e.g. DDP's buffer broadcast, FSDP's resharding


def _label(scope: str) -> tuple[str, str] | None:
    if scope in PHASE_SCOPES:
        return "other", scope
    if scope in LEAF_PARTS:
        return scope, "step"
    return None  # a block: phase comes from the enclosing phase scope


def _steps(ev: pd.DataFrame) -> list[tuple[float, float]]:
    is_step = (ev["cat"] == "user_annotation") & ev["name"].astype(str).str.startswith("ProfilerStep#")
    steps = ev[is_step]
    if len(steps):
        return [(float(t), float(t + d)) for t, d in zip(steps["ts"], steps["dur"])]
    host = ev[ev["cat"].isin(["cpu_op", "user_annotation"])]
    if not len(host):
        return []
    return [(float(host["ts"].min()), float((host["ts"] + host["dur"]).max()))]


def _nest(owners: list[_Owner]) -> None:
    """Fill each owner's exclusive time: duration minus direct children on the same thread."""
    for o in owners:
        o.exclusive = o.end - o.ts
    by_tid: dict[int, list[_Owner]] = defaultdict(list)
    for o in owners:
        by_tid[o.tid].append(o)
    for group in by_tid.values():
        group.sort(key=lambda o: (o.ts, -(o.end - o.ts)))
        stack: list[_Owner] = []
        for o in group:
            while stack and stack[-1].end <= o.ts:
                stack.pop()
            if stack:
                stack[-1].exclusive -= min(o.end, stack[-1].end) - o.ts
            stack.append(o)


def _innermost(owners: list[_Owner], tid: np.ndarray, ts: np.ndarray) -> list[_Owner | None]:
    """For each point (tid, ts), the innermost owner running on that thread that contains it."""
    result: list[_Owner | None] = [None] * len(ts)
    by_tid: dict[int, list[_Owner]] = defaultdict(list)
    for o in owners:
        by_tid[o.own_tid].append(o)
    order = np.lexsort((ts, tid))
    groups = {k: sorted(v, key=lambda o: (o.ts, -(o.end - o.ts))) for k, v in by_tid.items()}
    cur_tid, stack, nxt, group = None, [], 0, []
    for i in order:
        t, x = int(tid[i]), float(ts[i])
        if t != cur_tid:
            cur_tid, stack, nxt, group = t, [], 0, groups.get(t, [])
        while nxt < len(group) and group[nxt].ts <= x:
            while stack and stack[-1].end <= group[nxt].ts:
                stack.pop()
            stack.append(group[nxt])
            nxt += 1
        while stack and stack[-1].end <= x:
            stack.pop()
        result[i] = stack[-1] if stack else None
    return result


def attribute(table: TraceTable, clock: Clock | None = None) -> Attribution:
    """Per-block time of the profiled steps in ``table`` (see module doc for the rules)."""
    ev = table.events
    clock = clock or ("device" if table.has_gpu else "cpu")
    steps = _steps(ev)
    notes: list[str] = []
    if not steps:
        return Attribution(0, [], [], clock, ["trace has no host events"])
    names = ev["name"].astype(str)
    host = ev[ev["cat"].isin(["cpu_op", "user_annotation"])]
    host_names = names[host.index]
    scopes = host[(host["cat"] == "user_annotation") & host_names.str.startswith(SCOPE_PREFIX)]
    evals = host[(host["cat"] == "cpu_op") & host_names.str.startswith(EVAL_PREFIX)]
    fwd_ops = host[(host["cat"] == "cpu_op") & (host["seq"] >= 0) & ~host_names.str.startswith(EVAL_PREFIX)]
    comms = host[host_names.str.startswith(COMM_PREFIXES)]
    if clock == "device":
        dev = ev[ev["cat"].isin(DEVICE_CATS) & (ev["correlation"] >= 0)]
        rt = ev[ev["cat"].isin(RUNTIME_CATS) & (ev["correlation"] >= 0)]
        rt = rt.drop_duplicates("correlation")
        launches = dev.merge(rt[["correlation", "tid", "ts"]], on="correlation", suffixes=("", "_rt"))
    totals: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    step_us: list[float] = []
    unmapped_backward = 0
    for s0, s1 in steps:
        step_us.append(s1 - s0)
        owners: list[_Owner] = []
        sc = scopes[(scopes["ts"] >= s0) & (scopes["ts"] < s1)]
        phase_spans: list[_Owner] = []
        block_scopes: list[_Owner] = []
        for tid, ts, dur, name in zip(sc["tid"], sc["ts"], sc["dur"], names[sc.index]):
            scope = name[len(SCOPE_PREFIX):]
            label = _label(scope)
            o = _Owner(int(tid), float(ts), float(ts + dur), *(label or (scope, "")))
            owners.append(o)
            if scope in PHASE_SCOPES:
                phase_spans.append(o)
            elif label is None:
                block_scopes.append(o)
        for o in block_scopes:
            enclosing = [p for p in phase_spans if p.tid == o.tid and p.ts <= o.ts and o.end <= p.end]
            o.phase = enclosing[-1].phase if enclosing else "step"
        # Forward op sequence numbers -> the innermost block scope that ran them. An op that makes
        # no autograd node (dropout with p=0, a composite like linear) still shows the counter's
        # current value, which the next node-making op then takes: the last op with a number wins.
        fo = fwd_ops[(fwd_ops["ts"] >= s0) & (fwd_ops["ts"] < s1)]
        for b in (p for p in phase_spans if p.phase == "backward"):
            fo = fo[(fo["ts"] < b.ts) | (fo["ts"] >= b.end)]  # nodes' own ops carry the number too
        seq_block: dict[int, str] = {}
        if len(fo) and block_scopes:
            inner = _innermost(block_scopes, fo["tid"].to_numpy(), fo["ts"].to_numpy())
            for seq, o in zip(fo["seq"].to_numpy(), inner):
                seq_block[int(seq)] = o.name if o is not None else "other"
        # Backward nodes: owners named by the forward block; logically nested in the backward scope
        # even when the autograd engine runs them on its own thread.
        bwd_spans = [p for p in phase_spans if p.phase == "backward"]
        ev_s = evals[(evals["ts"] >= s0) & (evals["ts"] < s1)]
        for tid, ts, dur, seq, name in zip(ev_s["tid"], ev_s["ts"], ev_s["dur"], ev_s["seq"], names[ev_s.index]):
            span = next((b for b in bwd_spans if b.ts <= ts < b.end), None)
            if span is None:
                continue
            if "AccumulateGrad" in name:
                block = "accumulate_grad"
            else:
                block = seq_block.get(int(seq), "other")
                # Only worth a note when the trace has block scopes (not for compiled models).
                unmapped_backward += block == "other" and bool(block_scopes)
            owners.append(_Owner(span.tid, float(ts), float(ts + dur), block, "backward", launch_tid=int(tid)))
        cm = comms[(comms["ts"] >= s0) & (comms["ts"] < s1)]
        for tid, ts, dur, name in zip(cm["tid"], cm["ts"], cm["dur"], names[cm.index]):
            label = comm_label(name)
            # In the backward, the reducer runs on the autograd engine's thread: nest it like nodes.
            bwd = next((b for b in bwd_spans if b.ts <= ts < b.end), None)
            span = bwd or next((p for p in phase_spans if p.tid == tid and p.ts <= ts < p.end), None)
            owner_tid = bwd.tid if bwd else int(tid)
            owners.append(_Owner(owner_tid, float(ts), float(ts + dur), label, span.phase if span else "step",
                                 launch_tid=int(tid)))
        step_owner = _Owner(-(10**12), s0, s1, "other", "step")
        tids = {o.tid for o in owners} or {0}
        # The step range is on the main thread: pin it to the thread of the outermost scope.
        main_tid = min(owners, key=lambda o: o.ts).tid if owners else next(iter(tids))
        step_owner.tid = main_tid
        owners.append(step_owner)
        _nest(owners)
        if clock == "cpu":
            for o in owners:
                totals[(o.name, o.phase)] += o.exclusive
                calls[(o.name, o.phase)] += 1
        else:
            ln = launches[(launches["ts_rt"] >= s0) & (launches["ts_rt"] < s1)]
            launch_ts = ln["ts_rt"].to_numpy()
            inner = _innermost(owners, ln["tid_rt"].to_numpy(), launch_ts)
            busy = 0.0
            for dur, o, t in zip(ln["dur"].to_numpy(), inner, launch_ts):
                # A launch outside every owner on its thread (the autograd engine's own work on its
                # thread, a helper thread) belongs to the phase that was running at the time.
                target = o or next((p for p in phase_spans if p.ts <= t < p.end), None) or step_owner
                target.device += float(dur)
                busy += float(dur)
            for o in owners:
                if o is not step_owner and o.device > 0:
                    totals[(o.name, o.phase)] += o.device
                    calls[(o.name, o.phase)] += 1
            if step_owner.device > 0:
                totals[("other", "step")] += step_owner.device
            idle = (s1 - s0) - busy
            if idle < 0:
                notes.append("kernels on several streams overlap: device time exceeds the step's wall time")
            totals[("idle", "step")] += idle
    if unmapped_backward:
        notes.append(f"{unmapped_backward} backward node(s) had no forward op inside a block scope: shown as backward 'other'")
    n = len(steps)
    parts = [Part(name, phase, us / n, calls[(name, phase)] / n) for (name, phase), us in totals.items()]
    return Attribution(n, step_us, parts, clock, notes)
