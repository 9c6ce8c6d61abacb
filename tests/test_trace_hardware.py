"""Hardware use from kernel args (issue 19) on a trace written event by event, answers by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.analyze import analyze_table
from lmprof.trace.hardware import copy_kind, is_tensor_core_kernel
from lmprof.trace.load import load_trace
from test_trace_synthetic import T0, Trace

DATA = Path(__file__).parent / "data" / "traces"


def _kernel(tr: Trace, name: str, ts: float, dur: float, cat: str = "kernel", **args) -> None:
    tr.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": T0 + ts, "dur": dur,
                      "args": {"device": 0, "stream": 7, **args}})  # fmt: skip


def _trace() -> Trace:
    tr = Trace()
    res = lambda occ, bps, wps, regs, smem: {  # noqa: E731
        "est. achieved occupancy %": occ, "blocks per SM": bps, "warps per SM": wps,
        "registers per thread": regs, "shared memory": smem,
    }  # fmt: skip
    # 30 us tensor-core GEMM, 10 us elementwise, 60 us SIMT sgemm; resources per kernel:
    _kernel(tr, "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_tn", 0, 30, **res(50, 4.0, 16, 128, 32768))
    _kernel(tr, "void at::native::vectorized_elementwise_kernel<4>", 30, 10, **res(10, 0.5, 2, 16, 0))
    _kernel(tr, "ampere_sgemm_128x64_nn", 40, 60, **res(25, 2.0, 8, 64, 16384))
    _kernel(tr, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 20)  # communication: no args, not compute
    _kernel(tr, "Memcpy HtoD (Pinned -> Device)", 120, 100, cat="gpu_memcpy", bytes=2_500_000)
    _kernel(tr, "Memcpy HtoD (Pinned -> Device)", 220, 50, cat="gpu_memcpy", bytes=500_000)
    _kernel(tr, "Memset (Device)", 270, 10, cat="gpu_memset", bytes=1_000_000)
    return tr


def test_hand_computed_figures(tmp_path):
    hw = analyze_table(load_trace(_trace().write(tmp_path))).device.hardware
    assert hw.kernels == 4 and hw.with_resources == 3 and hw.resources_time_us == pytest.approx(100)
    # time-weighted over 30, 10, 60 us
    assert hw.occupancy_pct == pytest.approx((50 * 30 + 10 * 10 + 25 * 60) / 100)  # 31.0
    assert hw.low_occupancy_time_pct == pytest.approx(10.0)  # only the 10 us kernel is below 25%
    assert hw.blocks_per_sm == pytest.approx((4 * 30 + 0.5 * 10 + 2 * 60) / 100)
    assert hw.small_grid_time_pct == pytest.approx(10.0)
    assert hw.warps_per_sm == pytest.approx((16 * 30 + 2 * 10 + 8 * 60) / 100)
    assert hw.registers_per_thread == pytest.approx((128 * 30 + 16 * 10 + 64 * 60) / 100)
    assert hw.shared_memory_bytes == pytest.approx((32768 * 30 + 0 + 16384 * 60) / 100)
    # tensor cores: 30 us of 100 us compute (NCCL is communication, not compute)
    assert hw.compute_time_us == pytest.approx(100) and hw.tensor_core_time_us == pytest.approx(30)
    assert hw.tensor_core_pct == pytest.approx(30.0) and hw.tensor_core_kernels == 1
    copies = {c.kind: c for c in hw.copies}
    h2d = copies["Memcpy HtoD (Pinned -> Device)"]
    assert (h2d.count, h2d.bytes, h2d.time_us) == (2, 3_000_000, 150)
    assert h2d.achieved_gbps == pytest.approx(3_000_000 / 150e-6 / 1e9)  # 20 GB/s
    assert copies["Memset (Device)"].achieved_gbps == pytest.approx(100.0)


def test_tensor_core_name_rules():
    yes = ["volta_h884gemm_64x64_ldg8_nn", "turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_nn",
           "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize", "sm90_xmma_gemm_bf16bf16_bf16f32",
           "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>",
           "void flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "fmha_cutlassF_f16_aligned_64x64_rf_sm80",
           "sm90_gmma_kernel", "void wmma_example"]  # fmt: skip
    no = ["volta_sgemm_128x32_nt", "ampere_sgemm_32x128_nt", "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32>",
          "void at::native::vectorized_elementwise_kernel<4>", "ncclDevKernel_AllReduce", "gemv2T_kernel_val",
          "kernel_88416"]  # fmt: skip
    assert all(is_tensor_core_kernel(n) for n in yes), [n for n in yes if not is_tensor_core_kernel(n)]
    assert not any(is_tensor_core_kernel(n) for n in no), [n for n in no if is_tensor_core_kernel(n)]


def test_copy_kinds():
    assert copy_kind("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert copy_kind("Memset (Device)") == "Memset (Device)" and copy_kind("Memcpy DtoD") == "Memcpy DtoD"


def test_real_traces(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    hw = analyze_table(load_trace(DATA / "a100_alexnet_cuda_sync.json.gz")).device.hardware
    assert hw.with_resources == hw.kernels == 79 and 0 < hw.occupancy_pct < 100
    assert hw.tensor_core_kernels == 6 and 0 < hw.tensor_core_pct < 100  # sm80_xmma_fprop (tf32)
    h2d = next(c for c in hw.copies if c.kind.startswith("Memcpy HtoD"))
    assert h2d.achieved_gbps == pytest.approx(h2d.bytes / h2d.time_us / 1e3)
    rocm = analyze_table(load_trace(DATA / "amd_mi250_train.json.gz")).device.hardware
    assert rocm.with_resources == 0 and rocm.occupancy_pct is None  # ROCm traces carry no such args
    v100 = analyze_table(load_trace(DATA / "v100_train_rank0.json.gz")).device.hardware
    assert v100.tensor_core_kernels == 0  # fp32 volta_sgemm / scudnn: no tensor cores
    assert main(["analyze", str(DATA / "amd_mi250_train.json.gz")]) == 0
    assert "the trace has no kernel resource args" in " ".join(capsys.readouterr().out.split())
