"""Measured memory: exact bytes of the model and optimizer, and one step's allocation timeline.

What is measured, and how exact it is:

* **Parameters, gradients, optimizer state**: exact, from the live tensors (measure/tensor_bytes.py).
* **Timeline** (CPU and CUDA): one step's allocations and frees from the profiler's memory events
  (measure/memory_timeline.py).
* **Peak**: on CUDA ``torch.cuda.max_memory_allocated`` (the caching allocator's own count, exact);
  on CPU the timeline's peak (the CPU allocator reports only blocks allocated while profiling, so the
  level is "known state + what the step allocated").
* **Process peak RSS** (``resource.getrusage``): the whole process (Python, libraries, every tensor
  ever), never decreases; a coarse upper bound, not a per-step figure.
* **Snapshot** (CUDA): ``memory_snapshot.pickle`` from the allocator's history recorder, opens at
  https://pytorch.org/memory_viz.

CUDA calls go through :class:`~lmprof.measure.cuda_memory.TorchCuda`, so tests can pass a fake.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lmprof.measure.cuda_memory import CudaBackend, TorchCuda
from lmprof.measure.held import Held
from lmprof.measure.memory_timeline import MemoryEvents, MemoryTimeline, timeline_from_trace
from lmprof.measure.tensor_bytes import StaticMemory, peak_rss_bytes

SNAPSHOT_NAME = "memory_snapshot.pickle"


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
    # Training: tensors the model returned that the loop kept alive into backward, autograd's saved
    # ones aside (measure/held.py); None when not looked for (no backward, a compiled model).
    held: list[Held] | None = None

    @property
    def activations(self) -> int | None:
        return None if self.timeline is None else self.timeline.activations

    def value(self, key: str) -> tuple[int | None, str | None]:
        """(bytes, note) for a run-record key: params, grads, optimizer, activations, kv_cache, peak."""
        if key == "params":
            s = self.static
            if s.offloaded:  # accelerate's device_map keeps them on disk or another device between forwards
                return s.params, (f"{s.n_params - s.offloaded:,} of its {s.n_params:,} parameters, storages counted "
                                  f"once; {s.offloaded:,} were offloaded (on the meta device between forwards, "
                                  "brought in by each forward: their bytes come and go in the step's)")
            return s.params, f"{s.n_params:,} parameters, storages counted once"
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
            return self.activations, "allocated by the forward and still held at its end"
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
            # tensors the model returned that the loop kept alive into backward (measure/held.py)
            "held": None if self.held is None else [
                {"name": h.name, "shape": list(h.shape), "dtype": h.dtype, "bytes": h.bytes} for h in self.held],
            "notes": list(self.notes) + (tl.notes if tl else []),
        }


class MemoryWindow:
    """One step's memory, measured between :meth:`start` and :meth:`stop`.

    The step runs between the two calls, driven by whoever owns the loop (lmprof's own or the
    user's); the measurement is the same either way.
    """

    def __init__(self, device: Any, static_now: Callable[[], StaticMemory], *, out_dir: str | Path | None = None,
                 snapshot: bool = False, cuda: CudaBackend | None = None, snapshot_entries: int = 100_000):
        self.dev = _torch_device(device)
        self.static_now = static_now
        self.snapshot_dir = Path(out_dir) if snapshot and out_dir is not None and self.dev.type == "cuda" else None
        self.cu = (cuda or TorchCuda()) if self.dev.type == "cuda" else None
        self.snapshot_entries = snapshot_entries
        self._events: MemoryEvents | None = None
        self._before: StaticMemory | None = None
        self._baseline: dict[str, int] = {}

    def start(self) -> None:
        before = self._before = self.static_now()
        self._baseline = {
            "params": before.params + before.buffers,
            "optimizer": before.optimizer,
            "grads": before.grads,
            "kv_cache": 0,  # a generation's cache is made inside it: it is not in the baseline
        }
        if self.cu is not None:
            self.cu.synchronize(self.dev)
            # Everything else alive on the device (data, buffers of other modules) is "other".
            self._baseline["other"] = max(0, self.cu.memory_allocated(self.dev) - sum(self._baseline.values()))
            self.cu.reset_peak(self.dev)
            if self.snapshot_dir is not None:
                self.cu.start_history(self.snapshot_entries)
        self._events = MemoryEvents(self.dev)
        self._events.start()

    def abort(self) -> None:
        """Stop recording and keep nothing (the step failed)."""
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.stop()  # stopped, never exported: nothing of a failed step is read
            self._events = None
        if self.cu is not None and self.snapshot_dir is not None:
            with contextlib.suppress(Exception):
                self.cu.stop_history()

    def stop(self) -> None:
        """End the step's window (the device is synchronized first): only what must be read now."""
        assert self._events is not None and self._before is not None, "start() was not called"
        cu, dev = self.cu, self.dev
        self._peak: int | None = None
        self._stats: dict[str, Any] = {}
        self._snap_path: str | None = None
        if cu is None:
            self._events.stop()
            return
        try:
            cu.synchronize(dev)  # the step's kernels finish inside the recorded window
            self._events.stop()
            if self.snapshot_dir is not None:
                path = self.snapshot_dir / SNAPSHOT_NAME
                path.parent.mkdir(parents=True, exist_ok=True)
                cu.dump_snapshot(str(path))
                self._snap_path = str(path)
        finally:
            if self.snapshot_dir is not None:
                cu.stop_history()
        self._peak = cu.max_memory_allocated(dev)
        self._stats = _cuda_stats(cu.memory_stats(dev))

    def export_trace(self, path: Path) -> bool:
        """Write the step's recorded events as a trace at ``path`` (after :meth:`stop`, before
        :meth:`result`); False when nothing was recorded."""
        if self._events is None:
            return False
        self._events.export(path)
        return True

    def result(self) -> MeasuredMemory:
        """What the window measured (after :meth:`stop`): the events are read and classified here,
        so a caller inside someone else's step can leave this for later."""
        assert self._events is not None and self._before is not None, "stop() was not called"
        dev = self.dev
        notes: list[str] = []
        events = self._events.table()
        self._events = None
        timeline: MemoryTimeline | None = timeline_from_trace(events, dev, self._baseline)
        if self.cu is not None:
            peak = self._peak
            source = "torch.cuda.max_memory_allocated (caching allocator, exact)"
        else:
            assert timeline is not None
            peak = timeline.peak if timeline.events else None
            held = "model/optimizer" if self._before.optimizer else "model"  # inference holds no optimizer state
            source = (f"CPU: exact {held} bytes + net bytes the step allocated (profiler memory events); "
                      "not the process RSS")
            if dev.type != "cpu":
                # The profiler sees only host allocations here, so a timeline from them would describe
                # the CPU, not this device: report n/a rather than a wrong figure.
                notes.append(f"{dev.type}: device allocations are not reported to the profiler; peak and activations unknown")
                peak, source, timeline = None, f"no allocator statistics for {dev.type}", None
        return MeasuredMemory(
            device=str(dev), static=self._before, grads=None, peak=peak, peak_source=source, timeline=timeline,
            peak_rss=peak_rss_bytes(), cuda_stats=self._stats, snapshot_path=self._snap_path, notes=notes,
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
