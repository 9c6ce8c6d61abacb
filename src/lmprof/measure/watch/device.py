"""The hardware edges of the whole-run watch: a device clock read back asynchronously, memory counters.

Nothing here synchronizes the device. :class:`CudaTimer` records a CUDA event at each step boundary
and the watch asks ``event.query()`` later: an event is read (``elapsed_time``) only once the device
has passed it. A loss on the device is copied without blocking into pinned host memory right after
the step, ordered before the boundary event, and read when that event is done: ``.item()`` on a
CUDA tensor inside the loop would wait for the device every step. Tests replace these classes with
fakes of the same shape (:class:`DeviceTimer`, :class:`MemoryReader`).
"""
from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:  # torch is imported where a CUDA device is used: a CPU watch (and its tests) needs none
    import torch

NAN = float("nan")
# Events and pinned slots kept for reuse; more are made when the device falls further behind.
_POOL = 512
CPU_DEVICE_TIME = "n/a: a CPU run has no device clock apart from the host clock (step_s)"


class DeviceTimer(Protocol):
    """Marks on the device's stream, read back when the device has passed them."""

    def mark(self) -> Any: ...
    def done(self, mark: Any) -> bool: ...
    def elapsed_s(self, start: Any, end: Any) -> float: ...
    def release(self, mark: Any) -> None: ...
    def stage(self, value: torch.Tensor) -> Any | None: ...
    def read(self, staged: Any) -> float: ...


class CudaTimer:
    """CUDA events on the current stream of one device, pooled; scalars staged in pinned memory."""

    def __init__(self, device: torch.device):
        import torch

        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self._events: list[Any] = []
        self._slots: dict[torch.dtype, list[torch.Tensor]] = {}

    def mark(self) -> Any:
        import torch

        if self._events:
            ev = self._events.pop()
        else:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def done(self, mark: Any) -> bool:
        return bool(mark.query())

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def release(self, mark: Any) -> None:
        if len(self._events) < _POOL:
            self._events.append(mark)

    def stage(self, value: torch.Tensor) -> Any | None:
        """A non-blocking copy of a one-element tensor on this device into pinned host memory."""
        import torch

        if value.device != self.device:
            return None  # another device's stream: the copy would not be ordered before our event
        free = self._slots.setdefault(value.dtype, [])
        slot = free.pop() if free else torch.empty((), dtype=value.dtype, pin_memory=True)
        with torch.no_grad():
            slot.copy_(value.detach().reshape(()), non_blocking=True)
        return slot

    def read(self, staged: Any) -> float:
        """The staged value, once the mark recorded after it is done (no wait then)."""
        v = float(staged.item())
        free = self._slots.setdefault(staged.dtype, [])
        if len(free) < _POOL:
            free.append(staged)
        return v


class MemoryReader(Protocol):
    """(allocated, reserved, rss) bytes now; NaN for what this device does not have."""

    def read(self) -> tuple[float, float, float]: ...


class ProcRss:
    """The resident set size from /proc/self/statm, read with one pread on a descriptor kept open."""

    def __init__(self, path: str = "/proc/self/statm"):
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    @property
    def available(self) -> bool:
        return self._fd is not None

    def rss(self) -> float:
        if self._fd is None:
            return NAN
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return float(int(fields[1]) * self._page)
        except (OSError, IndexError, ValueError):
            return NAN

    def read(self) -> tuple[float, float, float]:
        return NAN, NAN, self.rss()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CudaMemory:
    """The caching allocator's current allocated and reserved bytes (its own counters: no sync), and RSS."""

    def __init__(self, device: torch.device, rss: ProcRss):
        import torch

        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._rss = rss
        # The nested form skips memory_stats' flattening of ~300 keys into one ordered dict.
        self._nested: Callable[[int], Any] | None = getattr(torch._C, "_cuda_memoryStats", None)

    def read(self) -> tuple[float, float, float]:
        import torch

        if self._nested is not None:
            s = self._nested(self.index)
            alloc, reserved = s["allocated_bytes"]["all"]["current"], s["reserved_bytes"]["all"]["current"]
        else:
            flat = torch.cuda.memory_stats(self.index)
            alloc, reserved = flat.get("allocated_bytes.all.current", NAN), flat.get("reserved_bytes.all.current", NAN)
        return float(alloc), float(reserved), self._rss.rss()


def read_cost_s(reader: MemoryReader, clock: Callable[[], float] = time.perf_counter, n: int = 5) -> float:
    """The median cost of one memory read, seconds (taken once, when the watch starts)."""
    costs = []
    for _ in range(n):
        t0 = clock()
        reader.read()
        costs.append(clock() - t0)
    costs.sort()
    return costs[len(costs) // 2]


def period_for(cost_s: float, step_s: float | None, share: float) -> int:
    """Do something that costs ``cost_s`` every N steps so that it costs at most ``share`` of a ``step_s``
    step (reading memory; feeding the detectors). 1 when the step time is not known."""
    if step_s is None or step_s <= 0 or cost_s <= 0:
        return 1
    return max(1, math.ceil(cost_s / (share * step_s)))


def device_edges(device: object, rss: ProcRss) -> tuple[DeviceTimer | None, MemoryReader, str | None]:
    """The timer, memory reader and (when there is no device clock) the reason device_s is n/a, for a
    ``torch.device`` or its name."""
    kind = str(device).split(":", 1)[0]
    if kind == "cuda":
        import torch

        dev = torch.device(device) if not isinstance(device, torch.device) else device  # type: ignore[call-overload]
        return CudaTimer(dev), CudaMemory(dev, rss), None
    if kind == "cpu":
        return None, rss, CPU_DEVICE_TIME
    return None, rss, f"n/a: device time is read from CUDA events only; not on {kind}"
