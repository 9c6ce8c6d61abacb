"""The CUDA allocator boundary: every CUDA memory call lmprof makes, behind one small protocol.

Tests pass a fake :class:`CudaBackend` in place of :class:`TorchCuda`, so the CUDA path of the
memory measurement runs on a machine without a GPU.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch



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
        from lmprof.atomic import atomic_path

        with atomic_path(path) as tmp:
            torch.cuda.memory._dump_snapshot(str(tmp))  # type: ignore[no-untyped-call]  # torch leaves _dump_snapshot unannotated

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)
