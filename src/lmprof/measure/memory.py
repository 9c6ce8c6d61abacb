"""Measured memory: exact bytes of the model and optimizer, and one step's allocation timeline.

What is measured, and how exact it is:

* **Parameters, gradients, optimizer state**: exact, from the live tensors (numel x element size),
  each storage counted once, so tied weights and views are not double counted. Gradients are read
  by a post-accumulate hook during backward (the step frees them again in ``zero_grad``).
* **Timeline** (CPU and CUDA): one step under ``torch.profiler`` with ``profile_memory=True``. Every
  allocation and free is an instant ``[memory]`` event with its size and address; the running sum,
  on top of the exactly known model/optimizer bytes, is the allocated memory over time. Phases come
  from the ``lmprof:<part>`` ranges the caller wraps around forward, backward, optimizer, ...
* **Peak**: on CUDA ``torch.cuda.max_memory_allocated`` (the caching allocator's own count, exact);
  on CPU the timeline's peak (the CPU allocator reports only blocks allocated while profiling, so the
  level is "known state + what the step allocated").
* **Process peak RSS** (``resource.getrusage``): the whole process (Python, libraries, every tensor
  ever), never decreases; a coarse upper bound, not a per-step figure.
* **Snapshot** (CUDA): ``memory_snapshot.pickle`` from the allocator's history recorder, opens at
  https://pytorch.org/memory_viz.

CUDA calls go through :class:`TorchCuda`, so tests can pass a fake in its place.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import resource
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import torch

from lmprof.names import INFER_PARTS, SCOPE_PREFIX, STEP_PARTS
from lmprof.workloads.blocks import scopes_enabled

# Timeline categories, bottom to top of the stacked plot.
CATEGORIES = ("params", "optimizer", "grads", "kv_cache", "activations", "outputs", "temporaries", "other")
_PARTS = set(STEP_PARTS) | set(INFER_PARTS)
SNAPSHOT_NAME = "memory_snapshot.pickle"


# -- exact bytes of live tensors ----------------------------------------------------------------

Range = tuple[Any, int, int]  # (storage key, first byte, end byte)


def tensor_range(t: torch.Tensor) -> Range:
    """The bytes of its storage a tensor can reach: (storage key, start, end).

    A distributed tensor (FSDP2's DTensor) counts its local shard: what this rank holds.
    A storage that was freed (FSDP's resharded full parameters) holds no bytes.
    """
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        t = to_local()
    try:
        st = t.untyped_storage()
        key = st.data_ptr() or id(st)  # meta / zero-size storages have no address
    except RuntimeError:  # "invalid python storage": freed under us, nothing held
        return (id(t), 0, 0)
    size = t.element_size()
    if t.numel() == 0:
        return (key, 0, 0)
    start = t.storage_offset() * size
    # The furthest element a strided view reaches (strides may be 0 or permuted).
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return (key, start, start + (last + 1) * size)


def ranges_bytes(ranges: Iterable[Range]) -> int:
    """Bytes covered by ranges, overlaps counted once (tied weights, views of one storage)."""
    by_key: dict[Any, list[tuple[int, int]]] = {}
    for key, lo, hi in ranges:
        if hi > lo:
            by_key.setdefault(key, []).append((lo, hi))
    total = 0
    for spans in by_key.values():
        spans.sort()
        cur_lo, cur_hi = spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                total += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        total += cur_hi - cur_lo
    return total


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes held by tensors, each storage byte counted once."""
    return ranges_bytes(tensor_range(t) for t in tensors)


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


@dataclass(frozen=True)
class StaticMemory:
    """Exact bytes of the model and optimizer at one moment.

    ``optimizer`` includes every tensor in ``optimizer.state``: AdamW's two moments per parameter
    and its 0-dim ``step`` counter per parameter (``optimizer_scalars``; 4 B each, kept on the CPU
    even for CUDA parameters unless ``capturable``/``fused``).
    """

    params: int
    buffers: int
    grads: int
    optimizer: int
    optimizer_scalars: int
    n_params: int

    @property
    def total(self) -> int:
        return self.params + self.buffers + self.grads + self.optimizer


def static_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StaticMemory:
    """Exact bytes of parameters, buffers, current gradients and optimizer state."""
    params = list(model.parameters())
    state = list(_state_tensors(optimizer)) if optimizer is not None else []
    return StaticMemory(
        params=tensor_bytes(params),
        buffers=tensor_bytes(model.buffers()),
        grads=tensor_bytes(p.grad for p in params if p.grad is not None),
        optimizer=tensor_bytes(state),
        optimizer_scalars=tensor_bytes(t for t in state if t.dim() == 0),
        n_params=sum(p.numel() for p in params),
    )


@contextlib.contextmanager
def record_grads(model: torch.nn.Module) -> Iterator[dict[int, Range]]:
    """Within the block, remember the storage range of every parameter's final .grad.

    Only the range is kept, never the tensor, so the step frees its gradients as it always would.
    """
    seen: dict[int, Range] = {}
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            def hook(param: torch.Tensor) -> None:
                if param.grad is not None:
                    seen[id(param)] = tensor_range(param.grad)
            handles.append(p.register_post_accumulate_grad_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


# -- the CUDA boundary --------------------------------------------------------------------------


class CudaBackend(Protocol):
    """What lmprof asks of torch.cuda about memory (tests substitute a fake)."""

    def synchronize(self, device: torch.device) -> None: ...
    def reset_peak(self, device: torch.device) -> None: ...
    def memory_allocated(self, device: torch.device) -> int: ...
    def max_memory_allocated(self, device: torch.device) -> int: ...
    def memory_stats(self, device: torch.device) -> dict[str, Any]: ...
    def start_history(self, max_entries: int) -> None: ...
    def dump_snapshot(self, path: str) -> None: ...
    def stop_history(self) -> None: ...


class TorchCuda:
    """The real torch.cuda memory API."""

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def reset_peak(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def memory_allocated(self, device: torch.device) -> int:
        return int(torch.cuda.memory_allocated(device))

    def max_memory_allocated(self, device: torch.device) -> int:
        return int(torch.cuda.max_memory_allocated(device))

    def memory_stats(self, device: torch.device) -> dict[str, Any]:
        return dict(torch.cuda.memory_stats(device))

    def start_history(self, max_entries: int) -> None:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)

    def dump_snapshot(self, path: str) -> None:
        torch.cuda.memory._dump_snapshot(path)

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)


def peak_rss_bytes() -> int:
    """The process's peak resident set size in bytes (whole process, never decreases)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes, Linux KiB


# -- timeline from profiler memory events -------------------------------------------------------


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


def classify(alloc_phase: str | None, free_phase: str | None, freed: bool) -> str:
    """A block's category from the phase that allocated it and the one that freed it.

    forward -> freed in backward: activations (saved for backward); freed in forward: temporaries;
    alive after backward: outputs (logits and loss the caller holds). backward -> freed in
    zero_grad or alive at the end: grads; freed in backward: temporaries. optimizer -> alive at the
    end: optimizer state (first step); freed in optimizer: temporaries. prefill/decode -> freed in
    the same phase: temporaries, else outputs. Anything else (data, outside any phase): other.
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
    if alloc_phase in INFER_PARTS:
        return "temporaries" if freed and free_phase == alloc_phase else "outputs"
    return "other"


def load_trace_events(trace: str | Path | dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The event list of a Chrome trace given as a path (.json or .json.gz), a dict or a list."""
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:  # type: ignore[operator]
            trace = json.load(fh)
    if isinstance(trace, dict):
        return list(trace.get("traceEvents", []))
    return list(trace)


def timeline_from_trace(
    trace: str | Path | dict[str, Any] | list[dict[str, Any]],
    device: torch.device | str = "cpu",
    baseline: dict[str, int] | None = None,
) -> MemoryTimeline:
    """Build the memory timeline from a Chrome trace recorded with ``profile_memory=True``.

    ``device`` picks the allocator's events (CPU or one CUDA device). ``baseline`` holds the bytes
    known to be alive before the trace by category (e.g. params, optimizer); the timeline's level is
    baseline + the running sum of the events' byte deltas.
    """
    dev = torch.device(device)
    events = load_trace_events(trace)
    want_type = 1 if dev.type == "cuda" else 0
    want_id = dev.index if dev.type == "cuda" else None
    mem: list[tuple[float, int, int, int]] = []
    phases: list[Phase] = []
    for ev in events:
        name = ev.get("name")
        if name == "[memory]":
            a = ev.get("args", {})
            if int(a.get("Device Type", 0)) != want_type:
                continue
            if want_id is not None and int(a.get("Device Id", want_id)) != want_id:
                continue
            mem.append((float(ev["ts"]), int(a.get("Ev Idx", 0)), int(a.get("Bytes", 0)), int(a.get("Addr", 0))))
        elif ev.get("ph") == "X" and ev.get("cat") == "user_annotation" and isinstance(name, str):
            part = name[len(SCOPE_PREFIX):] if name.startswith(SCOPE_PREFIX) else None
            if part in _PARTS:
                ts = float(ev["ts"])
                phases.append(Phase(part, ts, ts + float(ev.get("dur", 0.0))))
    mem.sort()
    phases.sort(key=lambda p: p.start_ms)
    t0 = phases[0].start_ms if phases else (mem[0][0] if mem else 0.0)
    phases = [Phase(p.name, (p.start_ms - t0) / 1e3, (p.end_ms - t0) / 1e3) for p in phases]
    return _build_timeline(mem, phases, t0, dict(baseline or {}), str(dev))


def _phase_at(phases: list[Phase], t_ms: float) -> str | None:
    for p in phases:
        if p.start_ms <= t_ms <= p.end_ms:
            return p.name
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
            cat_of[i] = classify(
                _phase_at(phases, times[i]), None if j is None else _phase_at(phases, times[j]), j is not None
            )
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
    fwd = [p for p in phases if p.name == "forward"]
    activations = None
    if fwd:
        before = _level_before(times, allocated, base_total, fwd[0].start_ms)
        after = _level_before(times, allocated, base_total, fwd[0].end_ms, inclusive=True)
        activations = after - before
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


def record_memory_events(fn: Callable[[], object], trace_path: Path | None = None) -> list[dict[str, Any]]:
    """Run ``fn`` once under torch.profiler with memory events; return the Chrome trace's events.

    Only the CPU activity is needed: allocator events (CPU and CUDA) are recorded on the host.
    torch.profiler cannot nest, so call this outside any other profiling.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = trace_path or Path(tmp) / "memory_trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return load_trace_events(path)


# -- one measured step --------------------------------------------------------------------------


@dataclass
class MeasuredMemory:
    """What one measured step (or inference run) gave. ``value(key)`` feeds the run record."""

    device: str
    static: StaticMemory
    grads: int | None
    peak: int | None
    peak_source: str
    timeline: MemoryTimeline | None
    peak_rss: int
    kv_cache: int | None = None
    cuda_stats: dict[str, Any] = field(default_factory=dict)
    snapshot_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def activations(self) -> int | None:
        return None if self.timeline is None else self.timeline.activations

    def value(self, key: str) -> tuple[int | None, str | None]:
        """(bytes, note) for a run-record key: params, grads, optimizer, activations, kv_cache, peak."""
        if key == "params":
            return self.static.params, f"{self.static.n_params:,} parameters, storages counted once"
        if key == "grads":
            if self.grads is None:
                return None, "no gradients were produced in the measured step"
            return self.grads, "every .grad after backward, storages counted once"
        if key == "optimizer":
            note = "optimizer.state tensors"
            if self.static.optimizer_scalars:
                note += f", incl. {self.static.optimizer_scalars} B of 0-dim step counters"
            return self.static.optimizer, note
        if key == "activations":
            if self.activations is None:
                return None, "no timeline with an lmprof:forward range"
            return self.activations, "allocated at the end of forward minus before it"
        if key == "kv_cache":
            if self.kv_cache is None:
                return None, "no KV cache in this run"
            return self.kv_cache, "bytes of the KV cache tensors"
        if key == "peak":
            return self.peak, self.peak_source
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (no per-event timeline)."""
        tl = self.timeline
        return {
            "device": self.device,
            "params": self.static.params,
            "buffers": self.static.buffers,
            "grads": self.grads,
            "optimizer": self.static.optimizer,
            "activations": self.activations,
            "kv_cache": self.kv_cache,
            "peak": self.peak,
            "peak_source": self.peak_source,
            "peak_phase": tl.peak_phase if tl else None,
            "peak_rss": self.peak_rss,
            "snapshot": self.snapshot_path,
            "notes": list(self.notes) + (tl.notes if tl else []),
        }


def measure_training_memory(
    step_fn: Callable[[], object],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    device: Any,
    out_dir: str | Path | None = None,
    snapshot: bool = True,
    warmup: int = 0,
    cuda: CudaBackend | None = None,
    snapshot_entries: int = 100_000,
) -> MeasuredMemory:
    """Measure one training step's memory; ``step_fn`` runs the whole step.

    ``step_fn`` should wrap its parts in ``lmprof.workloads.blocks.step_scope("forward")`` (or
    ``torch.profiler.record_function("lmprof:forward")``), likewise backward, optimizer, zero_grad and
    data, so the timeline has phases and activations can be read. ``device``: a string,
    torch.device or lmprof Device.
    ``warmup`` steps run first, unmeasured (after one, the optimizer state exists: the steady state).
    On CUDA, with ``out_dir`` and ``snapshot``, writes ``memory_snapshot.pickle`` there.
    Call it outside any other torch.profiler session.
    """
    dev = _torch_device(device)
    for _ in range(warmup):
        step_fn()
    # Step parts written with lmprof.workloads.blocks.step_scope emit their ranges only while scopes
    # are on; the model's sub-block scopes stay off, they would only add events.
    with record_grads(model) as grads_seen, scopes_enabled(True, model=False):
        result = _measure(step_fn, dev, lambda: static_memory(model, optimizer), out_dir, snapshot, cuda,
                          snapshot_entries)
    static_after = static_memory(model, optimizer)
    result.static = static_after
    result.grads = ranges_bytes(grads_seen.values()) if grads_seen else None
    return result


def measure_inference_memory(
    run_fn: Callable[[], object],
    model: torch.nn.Module,
    device: Any,
    kv_cache: Any | None = None,
    out_dir: str | Path | None = None,
    snapshot: bool = False,
    cuda: CudaBackend | None = None,
) -> MeasuredMemory:
    """Measure one inference run (prefill + decode, wrapped in lmprof:prefill / lmprof:decode).

    ``kv_cache`` is an object with ``nbytes()`` (lmprof's KVCache) allocated before the run; its
    bytes are part of the baseline.
    """
    dev = _torch_device(device)
    kv = int(kv_cache.nbytes()) if kv_cache is not None else None
    with scopes_enabled(True, model=False):
        result = _measure(run_fn, dev, lambda: static_memory(model), out_dir, snapshot, cuda, 100_000,
                          kv_bytes=kv or 0)
    result.kv_cache = kv
    return result


def _measure(
    fn: Callable[[], object],
    dev: torch.device,
    static_now: Callable[[], StaticMemory],
    out_dir: str | Path | None,
    snapshot: bool,
    cuda: CudaBackend | None,
    snapshot_entries: int,
    kv_bytes: int = 0,
) -> MeasuredMemory:
    before = static_now()
    baseline = {
        "params": before.params + before.buffers,
        "optimizer": before.optimizer,
        "grads": before.grads,
        "kv_cache": kv_bytes,
    }
    notes: list[str] = []
    stats: dict[str, Any] = {}
    snap_path: str | None = None
    if dev.type == "cuda":
        cu = cuda or TorchCuda()
        cu.synchronize(dev)
        allocated_before = cu.memory_allocated(dev)
        # Everything else alive on the device (data, buffers of other modules) is "other".
        baseline["other"] = max(0, allocated_before - sum(baseline.values()))
        cu.reset_peak(dev)
        recording = bool(snapshot and out_dir is not None)
        if recording:
            cu.start_history(snapshot_entries)
        try:
            events = record_memory_events(lambda: (fn(), cu.synchronize(dev)))
            if recording:
                path = Path(out_dir) / SNAPSHOT_NAME  # type: ignore[arg-type]
                path.parent.mkdir(parents=True, exist_ok=True)
                cu.dump_snapshot(str(path))
                snap_path = str(path)
        finally:
            if recording:
                cu.stop_history()
        peak = cu.max_memory_allocated(dev)
        stats = _cuda_stats(cu.memory_stats(dev))
        source = "torch.cuda.max_memory_allocated (caching allocator, exact)"
        timeline = timeline_from_trace(events, dev, baseline)
    else:
        events = record_memory_events(fn)
        timeline = timeline_from_trace(events, dev, baseline)
        peak = timeline.peak if timeline.events else None
        held = "model/optimizer" if before.optimizer else "model"  # inference holds no optimizer state
        source = (f"CPU: exact {held} bytes + net bytes the step allocated (profiler memory events); "
                  "not the process RSS")
        if dev.type != "cpu":
            # The profiler sees only host allocations here, so a timeline from them would describe
            # the CPU, not this device: report n/a rather than a wrong figure.
            notes.append(f"{dev.type}: device allocations are not reported to the profiler; peak and activations unknown")
            peak, source, timeline = None, f"no allocator statistics for {dev.type}", None
    return MeasuredMemory(
        device=str(dev), static=before, grads=None, peak=peak, peak_source=source, timeline=timeline,
        peak_rss=peak_rss_bytes(), cuda_stats=stats, snapshot_path=snap_path, notes=notes,
    )


def _torch_device(device: Any) -> torch.device:
    """A torch.device from a string, a torch.device or lmprof's Device (which has .torch_device)."""
    return getattr(device, "torch_device", None) or torch.device(device)


def _cuda_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The few allocator counters worth keeping: peaks, retries, OOMs, fragmentation."""
    keep = {
        "allocated_bytes.all.peak": "allocated_peak",
        "reserved_bytes.all.peak": "reserved_peak",
        "reserved_bytes.all.current": "reserved_current",
        "inactive_split_bytes.all.current": "inactive_split",
        "num_alloc_retries": "alloc_retries",
        "num_ooms": "ooms",
    }
    return {short: stats[k] for k, short in keep.items() if k in stats}
