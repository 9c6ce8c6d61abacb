"""The tables and columns of an Nsight Systems SQLite export that lmprof reads, written once.

Names as ``nsys export --type sqlite`` writes them (Nsight Systems 2022.4 to 2026.2; NVIDIA's
"SQLite schema reference"). Times are integer nanoseconds on the capture's clock. A column lmprof
can do without is optional: an older or trimmed export without it still loads.
"""
from __future__ import annotations

from dataclasses import dataclass

STRINGS = "StringIds"  # id -> value: kernel, API and registered NVTX names are ids into it
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"  # runtime and driver API calls (eventClass tells them apart)
NVTX = "NVTX_EVENTS"
GPU_INFO = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE")  # device names, when the export has them

ACTIVITY_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME)
EVENT_TABLES = (*ACTIVITY_TABLES, NVTX)

# NVTX_EVENTS.eventType (ENUM_NSYS_EVENT_TYPE): push/pop and start/end ranges; 75 names a domain
NVTX_RANGE_TYPES = (59, 60)
# CUPTI_ACTIVITY_KIND_RUNTIME.eventClass (ENUM_NSYS_EVENT_CLASS): 0 runtime API, 1 driver API
DRIVER_CLASS = 1


@dataclass(frozen=True)
class Source:
    """One table as lmprof reads it: required integer columns, then optional ones (-1 when absent)."""

    table: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


SOURCES = {
    KERNEL: Source(KERNEL, ("start", "end", "deviceId", "streamId"),
                   ("correlationId", "globalPid", "demangledName", "shortName", "registersPerThread",
                    "staticSharedMemory", "dynamicSharedMemory", "gridX", "gridY", "gridZ", "blockX", "blockY",
                    "blockZ")),
    MEMCPY: Source(MEMCPY, ("start", "end", "deviceId", "streamId"),
                   ("correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind")),
    MEMSET: Source(MEMSET, ("start", "end", "deviceId", "streamId"),
                   ("correlationId", "globalPid", "bytes", "memKind")),
    RUNTIME: Source(RUNTIME, ("start", "end", "globalTid", "nameId"), ("correlationId", "eventClass")),
    # text is read apart (it is text, not an integer); a range never ended has no integer end
    NVTX: Source(NVTX, ("start", "end", "eventType"), ("globalTid", "textId")),
}


def process_of(global_id: int) -> int:
    """The process id inside an nsys ``globalTid`` / ``globalPid`` (bits 24 to 47)."""
    return (global_id >> 24) & 0xFFFFFF


def thread_of(global_tid: int) -> int:
    """The thread id inside an nsys ``globalTid`` (its low 24 bits)."""
    return global_tid & 0xFFFFFF
