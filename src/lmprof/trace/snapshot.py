"""A CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) read safely and summarised.

The file is a pickle of plain containers: ``segments`` (each a cudaMalloc'd segment with its
``blocks``: address, size, state, the stack ``frames`` that allocated it) and ``device_traces`` (per
device, the allocator's recent actions: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``oom``, ... with size, ``time_us`` and frames).

**Never ``pickle.load``.** A pickle can name any importable callable and call it while loading, so
opening an untrusted one runs code. :class:`_PlainUnpickler` refuses every global (the only way a
pickle reaches code), so only the built-in containers and scalars can be built: nothing from the
file ever executes. The file must be a regular file of at most :data:`MAX_BYTES`; anything else,
or a pickle that is not a snapshot, is one :class:`DataError` line.

Figures (bytes): per device, ``reserved`` (segments' sizes) and ``allocated`` (blocks still held,
``active_allocated`` and ``active_pending_free``) at the snapshot; the peak allocated bytes within
the recorded history, rebuilt backwards from the snapshot's state through each ``alloc`` (+size) and
``free_completed`` (-size), as torch's memory_viz does; every ``oom`` with the bytes asked for, the
device's free bytes then, and the allocated bytes at that moment; the largest live blocks; live bytes
per allocating source line (the innermost frame outside torch) and per category.
"""
from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmprof.errors import DataError
from lmprof.trace.read import open_regular

MAX_BYTES = 1 << 30  # 1 GiB: a snapshot of the default 100,000 trace entries is tens of MB
MAX_FRAMES = 64  # frames looked at per block / action: a hostile file may share one huge list everywhere
LIVE_STATES = ("active_allocated", "active_pending_free")
CATEGORIES = ("optimizer", "backward", "forward", "other", "no stack")


class _PlainUnpickler(pickle.Unpickler):
    """Builds only built-in containers and scalars: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module[:80]}.{name[:80]}, which a snapshot never does")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("uses persistent ids, which a snapshot never does")


def read_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot's dict, unpickled with no code run; DataError for anything else."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_BYTES:
            raise DataError(f"{path}: {size:,} bytes is more than a memory snapshot's limit of {MAX_BYTES:,}")
        data = f.read(MAX_BYTES + 1)
    if not data:
        raise DataError(f"{path}: file is empty")
    try:
        snap = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise DataError(f"{path}: not a memory snapshot pickle ({' '.join(str(exc).split())[:200]})") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            MemoryError, RecursionError, UnicodeDecodeError) as exc:  # fmt: skip
        raise DataError(f"{path}: not a readable pickle ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise DataError(f"{path}: a pickle, but not a CUDA memory snapshot (no 'segments' list)")
    return snap


@dataclass(frozen=True)
class SnapshotDevice:
    device: int
    segments: int
    reserved_bytes: int
    allocated_bytes: int  # live blocks at the snapshot
    peak_allocated_bytes: int  # highest within the recorded history (>= allocated_bytes)
    peak_at_us: float | None  # time_us of the action that reached it; None: at the snapshot
    trace_entries: int


@dataclass(frozen=True)
class Allocation:
    device: int
    bytes: int
    requested_bytes: int | None
    state: str
    category: str
    frame: str | None  # the innermost frame outside torch, "file:line function"


@dataclass(frozen=True)
class FrameRow:
    frame: str
    blocks: int
    bytes: int


@dataclass(frozen=True)
class OomEvent:
    device: int
    requested_bytes: int
    device_free_bytes: int | None
    allocated_bytes: int  # allocated at that moment (rebuilt from the history)
    at_us: float | None
    frame: str | None


@dataclass(frozen=True)
class SnapshotReport:
    """What ``lmprof analyze SNAPSHOT.pickle`` prints."""

    path: str
    devices: list[SnapshotDevice]
    categories_bytes: dict[str, int]  # live bytes by category (see _category)
    top: list[Allocation]  # largest live blocks
    frames: list[FrameRow]  # live bytes per allocating source line
    ooms: list[OomEvent]
    notes: list[str] = field(default_factory=list)
    schema: str = "lmprof.snapshot/1"


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**63 else None


def _frames(x: Any) -> list[dict[str, Any]]:
    if not isinstance(x, list):
        return []
    return [f for f in x[:MAX_FRAMES] if isinstance(f, dict)]


def _where(f: dict[str, Any]) -> str:
    return f"{str(f.get('filename', '?'))[-120:]}:{_int(f.get('line')) or 0} {str(f.get('name', '?'))[:80]}"


def _user_frame(frames: list[dict[str, Any]]) -> str | None:
    """The innermost Python frame outside torch (the line of the user's code that allocated)."""
    for f in frames:
        name = str(f.get("filename", ""))
        if name.endswith(".py") and "/torch/" not in name and not name.startswith("<"):
            return _where(f)
    return _where(frames[0]) if frames else None


def _category(frames: list[dict[str, Any]]) -> str:
    """A coarse category from the stack (a heuristic on names): optimizer, backward, forward, other."""
    if not frames:
        return "no stack"
    text = " ".join(f"{f.get('filename', '')} {f.get('name', '')}" for f in frames).lower()
    if "/optim/" in text or "optimizer" in text or "zero_grad" in text:
        return "optimizer"
    if "backward" in text or "autograd" in text:
        return "backward"
    if "forward" in text:
        return "forward"
    return "other"


def snapshot_report(snap: dict[str, Any], path: str = "", top: int = 10) -> SnapshotReport:
    """The figures of the module docstring, from a snapshot dict (as :func:`read_snapshot` returns)."""
    notes: list[str] = []
    live: list[Allocation] = []
    per_dev: dict[int, dict[str, int]] = {}
    odd = 0
    for seg in snap.get("segments", []):
        if not isinstance(seg, dict):
            odd += 1
            continue
        dev = _int(seg.get("device"))
        dev = 0 if dev is None else dev
        d = per_dev.setdefault(dev, {"segments": 0, "reserved": 0, "allocated": 0})
        d["segments"] += 1
        d["reserved"] += max(_int(seg.get("total_size")) or 0, 0)
        blocks = seg.get("blocks")
        for b in blocks if isinstance(blocks, list) else []:
            size = _int(b.get("size")) if isinstance(b, dict) else None
            if size is None or size < 0:
                odd += 1
                continue
            state = str(b.get("state", ""))
            if state not in LIVE_STATES:
                continue
            d["allocated"] += size
            stack = _frames(b.get("frames"))
            req = _int(b.get("requested_size"))
            live.append(Allocation(dev, size, req, state, _category(stack), _user_frame(stack)))
    if odd:
        notes.append(f"{odd:,} segment(s) or block(s) were not of the snapshot's form: left out")
    traces = snap.get("device_traces")
    traces = traces if isinstance(traces, list) else []
    devices, ooms = [], []
    for dev in sorted(set(per_dev) | set(range(len(traces)))):
        d = per_dev.get(dev, {"segments": 0, "reserved": 0, "allocated": 0})
        entries = traces[dev] if dev < len(traces) and isinstance(traces[dev], list) else []
        peak, peak_at, dev_ooms = _replay(dev, entries, d["allocated"])
        ooms += dev_ooms
        devices.append(SnapshotDevice(dev, d["segments"], d["reserved"], d["allocated"], peak, peak_at, len(entries)))
    cats = {c: 0 for c in CATEGORIES}
    frames: dict[str, list[int]] = {}
    for a in live:
        cats[a.category] += a.bytes
        row = frames.setdefault(a.frame or "(no stack)", [0, 0])
        row[0] += 1
        row[1] += a.bytes
    live.sort(key=lambda a: -a.bytes)
    frame_rows = sorted((FrameRow(k, v[0], v[1]) for k, v in frames.items()), key=lambda r: (-r.bytes, r.frame))
    if live and all(a.category == "no stack" for a in live):
        notes.append("no stacks recorded: call torch.cuda.memory._record_memory_history() before the run "
                     "for per-line figures")  # fmt: skip
    return SnapshotReport(path, devices, {k: v for k, v in cats.items() if v}, live[:top], frame_rows[:top], ooms,
                          notes)


def _replay(dev: int, entries: list[Any], now: int) -> tuple[int, float | None, list[OomEvent]]:
    """Walk the history backwards from the snapshot's allocated bytes: the peak, when, and the OOMs."""
    allocated = now
    peak, peak_at = now, None
    ooms: list[OomEvent] = []
    for e in reversed(entries):
        if not isinstance(e, dict):
            continue
        action = e.get("action")
        size = _int(e.get("size")) or 0
        at = e.get("time_us")
        at_us = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        if action == "oom":
            frames = _frames(e.get("frames"))
            ooms.append(OomEvent(dev, size, _int(e.get("device_free")), allocated, at_us, _user_frame(frames)))
            continue
        # ``allocated`` is the state just after this action (a peak is always reached by an alloc;
        # >=: the earliest alloc that reached it); then step to just before the action
        if action == "alloc" and allocated >= peak:
            peak, peak_at = allocated, at_us
        if action == "alloc":
            allocated -= size
        elif action == "free_completed":
            allocated += size
    if allocated > peak:
        peak, peak_at = allocated, None
    ooms.reverse()
    return peak, peak_at, ooms
