"""One step's allocation timeline from the profiler's memory events, split into categories.

One step runs under ``torch.profiler`` with ``profile_memory=True``. Every allocation and free is an
instant ``[memory]`` event with its size and address; the running sum, on top of the exactly known
model/optimizer bytes, is the allocated memory over time. Phases come from the ``lmprof:<part>``
ranges the caller wraps around forward, backward, optimizer, ... Each block is put in a category by
when it was allocated and freed (:func:`classify`).
"""
from __future__ import annotations

import errno
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from lmprof.measure.native_logs import native_logs_dropped
from lmprof.names import INFER_PARTS, SCOPE_PREFIX, STEP_PARTS
from lmprof.trace import kinds
from lmprof.trace.load import TraceTable, load_trace

# Timeline categories, bottom to top of the stacked plot.
CATEGORIES = ("params", "optimizer", "grads", "kv_cache", "activations", "outputs", "temporaries", "other")
_PARTS = set(STEP_PARTS) | set(INFER_PARTS)




@dataclass(frozen=True)
class Phase:
    name: str
    start_ms: float
    end_ms: float


@dataclass
class MemoryTimeline:
    """Allocated bytes over one step, split into categories.

    ``t_ms[i]`` is the time of the i-th allocation/free (ms from the first phase's start),
    ``allocated[i]`` the total after it, ``categories[c][i]`` each category's share (they add up to
    ``allocated``). Categories come from each block's lifetime (see :func:`classify`); params,
    optimizer, grads and kv_cache also include the exactly known bytes alive before the step.
    """

    t_ms: list[float]
    allocated: list[int]
    categories: dict[str, list[int]]
    phases: list[Phase]
    baseline: int
    device: str
    peak: int
    peak_ms: float
    peak_phase: str | None
    activations: int | None
    events: int
    notes: list[str] = field(default_factory=list)

    def phase_peak(self, name: str) -> int | None:
        """The largest allocated level inside a phase, or None when the phase is missing."""
        ph = [p for p in self.phases if p.name == name]
        if not ph:
            return None
        vals = [a for t, a in zip(self.t_ms, self.allocated) if any(p.start_ms <= t <= p.end_ms for p in ph)]
        return max(vals) if vals else self.level_at(ph[0].start_ms)

    def level_at(self, t_ms: float) -> int:
        """Allocated bytes at time t (after every event at or before t)."""
        level = self.baseline
        for t, a in zip(self.t_ms, self.allocated):
            if t > t_ms:
                break
            level = a
        return level


def _training_forwards(forwards: list[Phase], backwards: list[Phase]) -> list[Phase]:
    """The forwards a backward follows (before the next forward begins), else all of them: a step that also
    evaluates the model without grad (each step, or the Trainer's eval_steps) runs a forward that saves
    nothing, and when it comes first (evaluated after the last optimizer step) it held no activations."""
    forwards = sorted(forwards, key=lambda f: f.start_ms)
    ends = [f.start_ms for f in forwards[1:]] + [float("inf")]
    trained = [f for f, nxt in zip(forwards, ends) if any(f.end_ms <= b.start_ms < nxt for b in backwards)]
    return trained or forwards


def classify(alloc_phase: str | None, free_phase: str | None, freed: bool, same_step: bool = True) -> str:
    """A block's category from the phase that allocated it and the one that freed it.

    forward -> freed in backward: activations (saved for backward); freed in forward: temporaries;
    alive after backward: outputs (logits and loss the caller holds). backward -> freed in
    zero_grad or alive at the end: grads; freed in backward: temporaries. optimizer -> alive at the
    end: optimizer state (first step); freed in optimizer: temporaries. grad_clip -> freed in it:
    temporaries (the norms). prefill/decode -> freed within the same step (``same_step``: the
    same prefill or decode range, not a later one of the same name): temporaries; else it is
    carried to a later step: kv_cache (the cache a generation grows; with it the few bytes the
    loop keeps for the next step, the last logits and token). Anything else (data, outside any
    phase): other.
    """
    if alloc_phase == "forward":
        if freed and free_phase == "forward":
            return "temporaries"
        if freed and free_phase == "backward":
            return "activations"
        return "outputs"
    if alloc_phase == "backward":
        if freed and free_phase == "backward":
            return "temporaries"
        if not freed or free_phase == "zero_grad":
            return "grads"
        return "other"
    if alloc_phase == "optimizer":
        if not freed:
            return "optimizer"
        return "temporaries" if free_phase == "optimizer" else "other"
    if alloc_phase == "grad_clip":
        return "temporaries" if freed and free_phase == "grad_clip" else "other"
    if alloc_phase in INFER_PARTS:
        return "temporaries" if freed and free_phase == alloc_phase and same_step else "kv_cache"
    return "other"


def timeline_from_trace(
    trace: str | Path | TraceTable,
    device: torch.device | str = "cpu",
    baseline: dict[str, int] | None = None,
) -> MemoryTimeline:
    """Build the memory timeline from a trace recorded with ``profile_memory=True``.

    ``trace`` is a loaded table or a trace file (read with :func:`lmprof.trace.load.load_trace`,
    the one parser of traces). ``device`` picks the allocator's events (CPU or one CUDA device).
    ``baseline`` holds the bytes known to be alive before the trace by category (e.g. params,
    optimizer); the timeline's level is baseline + the running sum of the events' byte deltas.
    """
    dev = torch.device(device)
    table = trace if isinstance(trace, TraceTable) else load_trace(trace)
    m = table.memory_cols  # numpy columns: reading a step's memory needs no pandas
    # an event without a device type is a CPU one, as torch writes it
    want = np.where(m["device_type"] >= 0, m["device_type"], 0) == (1 if dev.type == "cuda" else 0)
    if dev.type == "cuda" and dev.index is not None:
        # an event without a device id belongs to the device asked for, as before
        want &= (m["device_id"] == dev.index) | (m["device_id"] < 0)
    m = m.take(want)
    mem = sorted(zip(m["ts"].tolist(), np.maximum(m["ev_idx"], 0).tolist(), m["bytes"].tolist(), m["addr"].tolist()))
    ev = table.event_cols
    # lmprof's step-part ranges, by the trace engine's own rules for annotations and names
    scoped = kinds.annotation_mask(table) & kinds.name_mask(table, lambda n: n.startswith(SCOPE_PREFIX))
    phases: list[Phase] = []
    for name, ts, dur in zip(table.names()[scoped], ev["ts"][scoped], ev["dur"][scoped]):
        part = name[len(SCOPE_PREFIX):]
        if part in _PARTS:
            phases.append(Phase(part, float(ts), float(ts) + float(dur)))
    phases.sort(key=lambda p: p.start_ms)
    t0 = phases[0].start_ms if phases else (mem[0][0] if mem else 0.0)
    phases = [Phase(p.name, (p.start_ms - t0) / 1e3, (p.end_ms - t0) / 1e3) for p in phases]
    return _build_timeline(mem, phases, t0, dict(baseline or {}), str(dev))


def _phase_at(phases: list[Phase], t_ms: float) -> str | None:
    k = _phase_index(phases, t_ms)
    return None if k is None else phases[k].name


def _phase_index(phases: list[Phase], t_ms: float) -> int | None:
    """Which phase range (by position: the 3rd decode step, not just 'decode') holds ``t_ms``."""
    for k, p in enumerate(phases):
        if p.start_ms <= t_ms <= p.end_ms:
            return k
    return None


def _build_timeline(
    mem: list[tuple[float, int, int, int]], phases: list[Phase], t0: float, baseline: dict[str, int], device: str
) -> MemoryTimeline:
    notes: list[str] = []
    # Pass 1: pair allocations with frees by address to learn each block's lifetime.
    open_blocks: dict[int, int] = {}  # addr -> index of its allocation event
    free_of: dict[int, int] = {}  # allocation index -> free index
    unknown_frees = 0
    for i, (_, _, nbytes, addr) in enumerate(mem):
        if nbytes > 0:
            open_blocks[addr] = i
        elif nbytes < 0:
            j = open_blocks.pop(addr, None)
            if j is None:
                unknown_frees += 1
            else:
                free_of[j] = i
    times = [(ts - t0) / 1e3 for ts, _, _, _ in mem]
    cat_of: dict[int, str] = {}
    for i, (_, _, nbytes, _) in enumerate(mem):
        if nbytes > 0:
            j = free_of.get(i)
            where = _phase_index(phases, times[i])
            freed_where = None if j is None else _phase_index(phases, times[j])
            cat_of[i] = classify(None if where is None else phases[where].name,
                                 None if freed_where is None else phases[freed_where].name, j is not None,
                                 same_step=where == freed_where)
    # Pass 2: running totals per category.
    base_total = sum(baseline.values())
    level = {c: int(baseline.get(c, 0)) for c in CATEGORIES}
    alloc_idx_at: dict[int, int] = {}
    cats: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    allocated: list[int] = []
    total = base_total
    for i, (_, _, nbytes, addr) in enumerate(mem):
        total += nbytes
        if nbytes > 0:
            alloc_idx_at[addr] = i
            level[cat_of[i]] += nbytes
        elif nbytes < 0:
            j = alloc_idx_at.pop(addr, None)
            # A block from before the trace (CUDA reports those frees): take it from "other".
            level[cat_of[j] if j is not None else "other"] += nbytes
        allocated.append(total)
        for c in CATEGORIES:
            cats[c].append(level[c])
    # "other" may go below zero when pre-existing blocks are freed; fold that into the level shown.
    for k, v in enumerate(cats["other"]):
        if v < 0:
            cats["other"][k] = 0
            for c in ("temporaries", "outputs", "activations", "grads", "optimizer", "kv_cache", "params"):
                take = min(cats[c][k], -v)
                cats[c][k] -= take
                v += take
                if v >= 0:
                    break
    if unknown_frees:
        notes.append(f"{unknown_frees} frees of blocks allocated before profiling started")
    if allocated:
        k = max(range(len(allocated)), key=allocated.__getitem__)
        peak, peak_ms = allocated[k], times[k]
    else:
        peak, peak_ms = base_total, 0.0
        notes.append(f"no memory events for {device} in the trace")
    fwd = _training_forwards([p for p in phases if p.name == "forward"], [p for p in phases if p.name == "backward"])
    activations = None
    if fwd:
        # What the forward allocated and still holds when it ends: a block allocated before it and freed
        # inside it (a collector pass freeing an older step's or another object's tensors) is not the
        # forward's, so it does not lower the figure as a net level difference would.
        start, end = fwd[0].start_ms, fwd[0].end_ms
        activations = sum(nbytes for i, (_, _, nbytes, _) in enumerate(mem)
                          if nbytes > 0 and start <= times[i] <= end
                          and (free_of.get(i) is None or times[free_of[i]] > end))
    else:
        notes.append("no lmprof:forward range in the trace: activations unknown")
    return MemoryTimeline(
        t_ms=times, allocated=allocated, categories=cats, phases=phases, baseline=base_total, device=device,
        peak=peak, peak_ms=peak_ms, peak_phase=_phase_at(phases, peak_ms), activations=activations,
        events=len(mem), notes=notes,
    )


def _level_before(times: list[float], allocated: list[int], base: int, t_ms: float, inclusive: bool = False) -> int:
    level = base
    for t, a in zip(times, allocated):
        if t > t_ms or (t == t_ms and not inclusive):
            break
        level = a
    return level


class MemoryEvents:
    """torch.profiler with memory events, started and stopped by calls (a step someone else drives).

    Only the CPU activity is needed: allocator events (CPU and CUDA) are recorded on the host.
    torch.profiler cannot nest, so use it outside any other profiling.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        from torch.profiler import ProfilerActivity, profile

        # The device's own activity too, so that the recorded step can stand in as a profile of a
        # script too short for lmprof's profiled window (its kernels then have their device times).
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
        self._prof = profile(activities=acts, profile_memory=True)
        self._exported: Path | None = None
        self._attempted = False  # an export was tried: torch exports a profile once, even when the write failed

    def start(self) -> None:
        # Only the profiler's own start and stop are kept quiet: the step between may be the user's code.
        with native_logs_dropped():
            # c10 warns once per process ("Memory block of unknown size was allocated before the
            # profiling started", CPUAllocator.cpp) at the first free of an older block: in a user's
            # script that would land in the middle of their step. Free one here, while the line is
            # still being dropped, so the warning is spent.
            spent = torch.empty(1)
            self._prof.start()
            del spent

    def stop(self) -> None:
        """Stop recording (the events stay in memory until :meth:`table`)."""
        with native_logs_dropped():
            self._prof.stop()

    def export(self, path: Path) -> None:
        """Write the recorded events as a Chrome trace at ``path`` (atomically; after :meth:`stop`)."""
        from lmprof.measure.profiling import export_trace

        self._attempted = True
        export_trace(self._prof, path)
        self._exported = path  # torch exports a profile once: table() reads this file

    def table(self, trace_path: Path | None = None) -> TraceTable:
        """The recorded events, loaded with lmprof's trace reader (after :meth:`stop`)."""
        from lmprof.measure.profiling import export_trace

        if self._exported is not None:
            return load_trace(self._exported)
        if self._attempted:
            raise OSError(errno.EIO, "the recording's one export failed (torch writes a profile once)")
        with tempfile.TemporaryDirectory() as tmp:
            path = trace_path or Path(tmp) / "memory_trace.json"
            export_trace(self._prof, path)
            return load_trace(path)


def record_memory_events(fn: Callable[[], object], trace_path: Path | None = None) -> TraceTable:
    """Run ``fn`` once under torch.profiler with memory events; return the trace, loaded."""
    events = MemoryEvents()
    events.start()
    try:
        fn()
    finally:
        events.stop()
    return events.table(trace_path)
