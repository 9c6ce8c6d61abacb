"""How the device's resources were used, from what the trace already holds.

* Kernel resources (CUPTI args of each kernel, NVIDIA traces): ``est. achieved occupancy %``,
  ``blocks per SM``, ``warps per SM``, ``registers per thread``, ``shared memory`` (bytes per
  block). Averages are weighted by kernel duration, so they describe where the time went.
* Tensor-core share (matrix cores on AMD): kernel time in kernels whose name marks them as such (see
  :data:`TENSOR_CORE_RE`); an estimate from names, never measured.
* Copies: bytes (``args.bytes``) and time of each memcpy / memset kind, and the achieved bandwidth.
  The trace does not record the link (PCIe generation, NVLink), so no peak is compared with.
"""
from __future__ import annotations

import re

import numpy as np

from lmprof.trace import kinds
from lmprof.trace.load import TraceTable
from lmprof.trace.records import Record

# Tensor-core kernels by name (case-insensitive): cuBLAS/cuDNN MMA shapes (h884, s1688, h16816, i8816,
# s16832: volta_h884gemm_*, turing_fp16_s1688gemm_*, ampere_fp16_s16816gemm_*), SASS-level names
# (hmma, imma, xmma, gmma, wgmma: sm80_xmma_gemm_*, sm90_xmma_*), CUTLASS (tensorop, wmma), and fused
# attention kernels that run on tensor cores (flash_fwd/flash_bwd, fmha); cuBLAS's GEMMs on Hopper and
# Blackwell (nvjet_*), and TensorRT-LLM's generated GEMMs, which name their MMA instruction shape beside a
# thread-block cluster (bmm_..._m128x16x32_cga1x1x1_...). AMD's matrix cores (MFMA) the
# same way: rocBLAS/hipBLASLt's Tensile kernels name their matrix instruction (Cijk_..._MT256x128x64_
# MI16x16x1_...), Composable Kernel its XDL ops (gemm_xdl_cshuffle, *_xdlops_*), MIOpen's implicit GEMMs
# their xdlops generation (igemm_fwd_gtcx2_*), and some name mfma itself. Plain sgemm/SIMT kernels and
# elementwise kernels do not match, nor MIOpen's elementwise SubTensorOp* ("tensorop" only as CUTLASS writes it,
# after a separator).
TENSOR_CORE_RE = re.compile(
    r"(?<![0-9a-z])[hsi](?:884|1688|16816|8816|16832)|hmma|imma|xmma|wgmma|gmma|(?<![a-z])tensorop|wmma|"
    r"tensor_?core|flash_?(?:fwd|bwd)|fmha|nvjet|(?<![0-9a-z])m\d+x\d+x\d+_cga\d|"
    r"(?<![0-9a-z])MI\d+x\d+x\d+|(?<![a-z])xdl|(?<![a-z])gtcx|mfma",
    re.IGNORECASE,
)
LOW_OCCUPANCY_PCT = 25.0
_COPY_KIND = re.compile(r"^(Memcpy|Memset)\s*([A-Za-z]+)?\s*(\([^)]*\))?")


def is_tensor_core_kernel(name: str) -> bool:
    """True when a kernel's name marks it as a tensor-core kernel (see :data:`TENSOR_CORE_RE`)."""
    return TENSOR_CORE_RE.search(name) is not None


def copy_kind(name: str) -> str:
    """``Memcpy HtoD (Pageable -> Device)`` -> ``Memcpy HtoD (Pageable -> Device)``; other names as they are."""
    m = _COPY_KIND.match(name.strip())
    return " ".join(p for p in m.groups() if p) if m else name.strip()[:60]


class CopyRow(Record, frozen=True):
    """One kind of memcpy / memset."""

    kind: str
    count: int
    bytes: int  # summed args.bytes (events without it are not counted here)
    time_us: float
    achieved_gbps: float | None  # bytes / time, 1 GB/s = 1e9 B/s


class HardwareUse(Record, frozen=True):
    """Resource use of the window's kernels and copies. ``None`` where the trace has no such args."""

    kernels: int  # kernels (category kernel) in the window
    with_resources: int  # of them, with CUPTI resource args
    resources_time_us: float  # summed duration of those
    occupancy_pct: float | None  # est. achieved occupancy, weighted by duration
    low_occupancy_time_pct: float | None  # share of that time in kernels below LOW_OCCUPANCY_PCT
    blocks_per_sm: float | None  # weighted by duration
    small_grid_time_pct: float | None  # share of that time in kernels with < 1 block per SM
    warps_per_sm: float | None
    registers_per_thread: float | None
    shared_memory_bytes: float | None  # per block
    compute_time_us: float  # summed duration of computation kernels
    tensor_core_time_us: float  # of it, in tensor-core kernels (by name)
    tensor_core_pct: float | None  # of compute_time_us; estimated from kernel names
    tensor_core_kernels: int
    copies: list[CopyRow]


def hardware_use(table: TraceTable, rows: np.ndarray) -> HardwareUse:
    """Resource use over the device ``rows`` (the window)."""
    dur = table.durations()
    is_kernel = kinds.kernel_mask(table)[rows]
    k_rows = rows[is_kernel]
    hw = table.hw_cols
    pos, found = _lookup(hw["row"], k_rows)
    occ_all = hw["occupancy"]
    has = found.copy()
    has[found] = ~np.isnan(occ_all[pos[found]]) | ~np.isnan(hw["registers"][pos[found]])
    r_pos = pos[has]
    w = dur[k_rows[has]]
    wsum = float(w.sum())

    def weighted(col: str) -> float | None:
        v = hw[col][r_pos]
        ok = ~np.isnan(v)
        return float((v[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() and w[ok].sum() > 0 else None

    def share(col: str, below: float) -> float | None:
        v = hw[col][r_pos]
        ok = ~np.isnan(v)
        total = w[ok].sum()
        return float(100.0 * w[ok][v[ok] < below].sum() / total) if ok.any() and total > 0 else None

    types = kinds.kernel_types(table, k_rows)
    comp = k_rows[types == kinds.COMPUTE]
    tc = kinds.name_mask(table, is_tensor_core_kernel)[comp]
    comp_time = float(dur[comp].sum())
    tc_time = float(dur[comp][tc].sum())
    return HardwareUse(
        kernels=len(k_rows),
        with_resources=int(has.sum()),
        resources_time_us=wsum,
        occupancy_pct=weighted("occupancy"),
        low_occupancy_time_pct=share("occupancy", LOW_OCCUPANCY_PCT),
        blocks_per_sm=weighted("blocks_per_sm"),
        small_grid_time_pct=share("blocks_per_sm", 1.0),
        warps_per_sm=weighted("warps_per_sm"),
        registers_per_thread=weighted("registers"),
        shared_memory_bytes=weighted("shared_memory"),
        compute_time_us=comp_time,
        tensor_core_time_us=tc_time,
        tensor_core_pct=100.0 * tc_time / comp_time if comp_time > 0 else None,
        tensor_core_kernels=int(tc.sum()),
        copies=_copies(table, rows[~is_kernel], dur),
    )


def _lookup(sorted_rows: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each of ``rows`` in ``sorted_rows``, and whether it is there."""
    if sorted_rows.size == 0:
        return np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=bool)
    pos = np.searchsorted(sorted_rows, rows)
    return pos, (pos < len(sorted_rows)) & (sorted_rows[np.minimum(pos, len(sorted_rows) - 1)] == rows)


def _copies(table: TraceTable, rows: np.ndarray, dur: np.ndarray) -> list[CopyRow]:
    hw = table.hw_cols
    pos, found = _lookup(hw["row"], rows)
    nbytes = np.full(len(rows), np.nan)
    nbytes[found] = hw["nbytes"][pos[found]]
    sized = np.flatnonzero(~np.isnan(nbytes))  # events without args.bytes are not counted
    # copy names repeat (a handful of kinds over thousands of copies): classify each name once
    ev = table.event_cols
    labels = ev.labels("name")
    codes, code_of = np.unique(ev["name"][rows[sized]], return_inverse=True)
    kind_ids: dict[str, int] = {}
    kind_of_code = [
        kind_ids.setdefault(copy_kind(str(labels[c]) if c >= 0 else "nan"), len(kind_ids))
        for c in codes.tolist()
    ]
    kind = np.asarray(kind_of_code, dtype=np.int64)[code_of.ravel()]
    by_id = {k: n for n, k in kind_ids.items()}
    # rows listed by kind in order of first appearance: the order that equal times keep below
    _, first = np.unique(kind, return_index=True)
    out = []
    for k in kind[np.sort(first)].tolist():
        idx = sized[kind == k]
        b = int(nbytes[idx].sum())
        t = float(dur[rows[idx]].sum())
        out.append(CopyRow(by_id[k], len(idx), b, t, b / t / 1e3 if t > 0 else None))
    out.sort(key=lambda c: -c.time_us)
    return out
