"""What each trace event is: device work, runtime call, CPU operator, step annotation, sync call.

Every rule that classifies events by category or name lives here, so the analyses agree and the
rules are documented once (docs/trace-analysis.md repeats them). All functions work on the
categorical codes of :class:`~lmprof.trace.load.TraceTable` columns, so each distinct name is looked
at once, not once per event.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from lmprof.trace.frame import Frame
from lmprof.trace.load import TraceTable

# Device activity that occupies the GPU timeline. "memcpy"/"memset" are the pre-2021 Kineto names.
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset", "memcpy", "memset"})
# CPU operators recorded by the PyTorch dispatcher ("operator" in old traces).
OP_CATS = frozenset({"cpu_op", "operator"})
ANNOTATION_CATS = frozenset({"user_annotation"})
# Events drawn on GPU tracks that are not host work (and not device work either).
GPU_TRACK_CATS = frozenset({"gpu_user_annotation", "cuda_sync", "ac2g", "trace"})

# Kernel types, HTA's three: the order is the priority used when they overlap in time.
COMPUTE, COMMUNICATION, MEMORY = 0, 1, 2
KERNEL_TYPE_NAMES = ("computation", "communication", "memory")

_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


def is_runtime_cat(cat: str) -> bool:
    """CUDA / HIP runtime and driver API calls (cuda_runtime, cuda_driver, hip_runtime, ...)."""
    return cat.endswith("_runtime") or cat.endswith("_driver") or cat in ("runtime", "driver")


def is_sync_call(name: str) -> bool:
    """A runtime call that blocks the host until device work finishes.

    ``*Synchronize`` (stream, device, event, context; CUDA, driver API and HIP) and the blocking
    copies: ``cudaMemcpy*`` / ``hipMemcpy*`` / ``cuMemcpy*`` without ``Async`` (``.item()``,
    ``.cpu()``, ``.tolist()`` end in one of these). ``hipMemcpyWithStream`` is blocking too.
    """
    if "Synchronize" in name:
        return True
    return name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) and "Async" not in name


def kernel_type_of(name: str, cat: str) -> int:
    """HTA's kernel type: NCCL/RCCL kernels are communication, memcpy/memset memory, rest compute."""
    low = name.lower()
    if "nccl" in low or "rccl" in low:
        return COMMUNICATION
    if cat in MEMORY_CATS or "Memcpy" in name or "Memset" in name:
        return MEMORY
    return COMPUTE


def step_number(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` annotation, else None (also when N does not fit in 64 bits)."""
    m = _STEP_RE.match(name)
    if not m or len(m.group(1)) > 19:
        return None
    n = int(m.group(1))
    return n if n < 2**63 else None


def cat_mask(table: TraceTable, pred: Callable[[str], bool]) -> np.ndarray:
    """Rows whose category satisfies ``pred`` (evaluated once per distinct category)."""
    return _category_mask(table.event_cols, "cat", pred)


def name_mask(table: TraceTable, pred: Callable[[str], bool]) -> np.ndarray:
    """Rows whose name satisfies ``pred`` (evaluated once per distinct name)."""
    return _category_mask(table.event_cols, "name", pred)


def _category_mask(ev: Frame, col: str, pred: Callable[[str], bool]) -> np.ndarray:
    labels = ev.labels(col)
    hits = np.fromiter((bool(pred(str(c))) for c in labels), dtype=bool, count=len(labels))
    codes = ev[col]
    # code -1 (missing) never matches; np.take gathers int32 indices faster than indexing does
    return np.take(np.concatenate([hits, [False]]), codes)


def _cached_array(table: TraceTable, key: str, make: Callable[[], np.ndarray]) -> np.ndarray:
    """The array ``make`` builds, kept in ``table.cache``: several analyses ask for the same masks
    of the same table. Read-only, so no caller can change what the others see."""
    arr = table.cache.get(key)
    if arr is None:
        arr = make()
        arr.setflags(write=False)
        table.cache[key] = arr
    return arr


def device_mask(table: TraceTable) -> np.ndarray:
    """Kernels, memcpys and memsets: the events that occupy the device timeline."""
    return _cached_array(table, "device_mask", lambda: cat_mask(table, DEVICE_CATS.__contains__))


def kernel_mask(table: TraceTable) -> np.ndarray:
    """Kernels (category ``kernel``): device events that are neither memcpy nor memset."""
    return _cached_array(table, "kernel_mask", lambda: cat_mask(table, lambda c: c == "kernel"))


def runtime_mask(table: TraceTable) -> np.ndarray:
    """CUDA / HIP runtime and driver calls."""
    return _cached_array(table, "runtime_mask", lambda: cat_mask(table, is_runtime_cat))


def op_mask(table: TraceTable) -> np.ndarray:
    """CPU operators (cpu_op)."""
    return _cached_array(table, "op_mask", lambda: cat_mask(table, OP_CATS.__contains__))


def annotation_mask(table: TraceTable) -> np.ndarray:
    """Host-side ``record_function`` ranges (user_annotation), ProfilerStep#N included."""
    return _cached_array(table, "annotation_mask", lambda: cat_mask(table, ANNOTATION_CATS.__contains__))


def host_mask(table: TraceTable) -> np.ndarray:
    """Events of host threads: everything but device work, GPU-track markers and unsupported device work."""
    other_device = unsupported_device_events(table)
    return _cached_array(
        table,
        "host_mask",
        lambda: cat_mask(
            table,
            lambda c: c not in DEVICE_CATS
            and c not in GPU_TRACK_CATS
            and not c.startswith("gpu_")
            and c not in other_device,
        ),
    )


# Categories known to be host work (so never taken for an unknown device's work).
HOST_CATS = frozenset({"python_function", "trace", "cpu_instant_event", "overhead", "fwdbwd", "ac2g"})
# Words in a category that say it is drawn from an accelerator (MTIA's mtia_ccp_events, ...).
_DEVICE_WORDS = ("kernel", "ccp", "device", "mtia", "xpu", "hpu", "npu", "tpu", "accelerator")


def unsupported_device_events(table: TraceTable) -> dict[str, int]:
    """Categories that hold device work lmprof does not analyse, with their event counts.

    A category is taken for unsupported device work when it is none of the known host, device
    and GPU-track categories and either its name says so (contains kernel, ccp, device, mtia, xpu,
    hpu, npu, tpu or accelerator) or most of its events carry ``args.stream`` (only device events
    have a stream). Example: MTIA traces put their device work in ``mtia_ccp_events``.
    """
    cached = table.cache.get("unsupported_device_events")
    if cached is not None:
        return cached
    ev = table.event_cols
    labels = ev.labels("cat")
    codes = ev["cat"]
    counts = np.bincount(codes[codes >= 0], minlength=len(labels))
    with_stream = np.bincount(codes[(codes >= 0) & (ev["stream"] >= 0)], minlength=len(labels))
    out: dict[str, int] = {}
    for i, c in enumerate(map(str, labels)):
        if not counts[i] or _known_cat(c):
            continue
        if any(w in c for w in _DEVICE_WORDS) or 2 * with_stream[i] > counts[i]:
            out[c] = int(counts[i])
    table.cache["unsupported_device_events"] = out
    return out


def _known_cat(c: str) -> bool:
    return (
        c in DEVICE_CATS
        or c in GPU_TRACK_CATS
        or c.startswith("gpu_")
        or c in OP_CATS
        or c in ANNOTATION_CATS
        or c in HOST_CATS
        or is_runtime_cat(c)
    )


def kernel_types(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """Kernel type (COMPUTE / COMMUNICATION / MEMORY) of the given device rows, as int8."""
    ev = table.event_cols
    labels = ev.labels("name")

    def by_name() -> np.ndarray:  # one type per distinct name (HTA's rule on the name alone)
        types = np.fromiter((kernel_type_of(str(n), "") for n in labels), dtype=np.int8, count=len(labels))
        return np.concatenate([types, np.array([COMPUTE], dtype=np.int8)])  # code -1: no name

    out = _cached_array(table, "kernel_type_by_name", by_name)[ev["name"][rows]]
    memory_cat = _cached_array(table, "memory_cat_mask", lambda: cat_mask(table, MEMORY_CATS.__contains__))[rows]
    out[(out == COMPUTE) & memory_cat] = MEMORY
    return out


def sync_mask(table: TraceTable) -> np.ndarray:
    """Runtime calls that block the host on the device (see :func:`is_sync_call`)."""
    return _cached_array(table, "sync_mask", lambda: runtime_mask(table) & name_mask(table, is_sync_call))
