"""`lmprof analyze` of real ROCm LLM traces that nobody here wrote (TraceLens' test data: SGLang on an MI300X,
vLLM replaying a HIP graph, an MI210's device events, one profiled step of Qwen1.5-0.5B on an MI300X;
tests/data/traces/PROVENANCE.md).

Truths: the trace read event by event with the standard library (json + gzip), not with lmprof's reader: the
device events' count and summed time; and the matrix-core share, from the kernels this file names by hand
as AMD matrix-core (MFMA) kernels, with the rule that says how each is recognised. Until this session every
AMD trace read 0% there (0 kernels): the rule knew only NVIDIA's names. The MI210's MIOpen elementwise
kernels (SubTensorOpWithScalar1d, ...) counted as tensor-core kernels ("tensorop" inside their names).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lmprof.trace.analyze import analyze_table
from lmprof.trace.hardware import is_tensor_core_kernel
from lmprof.trace.load import load_trace

DATA = Path(__file__).parent / "data" / "traces"
THEIRS = ["mi300x_sglang_qwen3_decode", "rocm_vllm_decode_graph", "mi210_gpu_only", "amd_mi250_train"]
ONE_STEP = "mi300x_vf_qwen15_05b_one_step"
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def _events(name: str) -> list[dict]:
    with gzip.open(DATA / f"{name}.json.gz") as f:
        return [e for e in json.load(f)["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]


@pytest.mark.parametrize("name", THEIRS)
def test_device_events_add_up_as_the_trace_wrote_them(name: str) -> None:
    device = [e for e in _events(name) if e.get("cat") in DEVICE]
    kernels = analyze_table(load_trace(DATA / f"{name}.json.gz")).device.kernels
    assert kernels.count == len(device)
    assert kernels.total_us == pytest.approx(sum(float(e["dur"]) for e in device), abs=1e-3)


# By hand, from each name: Tensile's matrix instruction (rocBLAS/hipBLASLt, "_MI16x16x1_"), an MFMA kernel named
# so (vLLM's paged attention for ROCm), MIOpen's xdlops implicit GEMMs ("gtcx2"). Prefixes, as the names are long.
MATRIX_CORE = {
    "mi300x_sglang_qwen3_decode": ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_",
                                   "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_",
                                   "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1_",
                                   "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT16x32x512_MI16x16x1_",
                                   "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x48x64_MI16x16x1_",
                                   "void paged_attention_ll4mi_QKV_mfma16_kernel<"),
    "amd_mi250_train": ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_",
                        "Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_"),
    "mi210_gpu_only": ("igemm_wrw_gtcx2_", "igemm_bwd_gtcx2_", "igemm_fwd_gtcx2_",
                       "Cijk_Ailk_Bjlk_BBS_BH_Bias_HAS_SAV_UserArgs_MT128x64x32_MI32x32x1_",
                       "Cijk_Ailk_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT16x64x64_MI16x16x1_",
                       "Cijk_Alik_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT32x32x64_MI16x16x1_"),
}


@pytest.mark.parametrize("name", sorted(MATRIX_CORE))
def test_the_matrix_core_share_is_that_of_the_kernels_named_by_hand(name: str) -> None:
    kernels = [e for e in _events(name) if e.get("cat") == "kernel"]  # none of them is communication
    mfma = sum(float(e["dur"]) for e in kernels if e["name"].startswith(MATRIX_CORE[name]))
    hw = analyze_table(load_trace(DATA / f"{name}.json.gz")).device.hardware
    assert hw.compute_time_us == pytest.approx(sum(float(e["dur"]) for e in kernels), abs=1e-3)
    assert hw.tensor_core_time_us == pytest.approx(mfma, abs=1e-3) and mfma > 0  # was 0 (or MIOpen's elementwise)
    assert hw.tensor_core_kernels == sum(e["name"].startswith(MATRIX_CORE[name]) for e in kernels)


def test_amd_and_newer_nvidia_names() -> None:
    yes = ["Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1",
           "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm",
           "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3>",
           "igemm_fwd_gtcx2_nhwc_bf16_bx0_ex1_bt32x256x32_wt16x64x4", "void paged_attention_ll4mi_QKV_mfma16_kernel<0>",
           "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmha",
           "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN",
           "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN"]
    no = ["SubTensorOpWithCastTensor1d", "SubTensorOpWithScalar1d", "batched_transpose_16x32_half",
          "Cijk_Ailk_Bljk_SB_MT128x128x8_SE_GRVW4_K1_NLCA1", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
          "void at::native::batch_norm_backward_kernel<c10::BFloat16>", "attn_fwd", "kernel_mi300x_copy"]
    assert [n for n in yes if not is_tensor_core_kernel(n)] == []
    assert [n for n in no if is_tensor_core_kernel(n)] == []


def test_one_profiled_step_is_timed_as_tracelens_times_it() -> None:
    """A trace of one profiled step (schedule(active=1)) also holds device work queued before the profiler
    recorded: 463 device events whose launching call is not in the trace, a previous step's tail. With one step
    lmprof kept every device event: a 47.1 ms window, 43.1 ms busy. Truths: TraceLens' own report of this trace
    (its tests/traces/compare_test_e2e/reference/mi300_perf_report_csvs/gpu_timeline.csv, times in ms: its window
    is the device-side ProfilerStep annotation), and the trace read event by event."""
    events = _events(ONE_STEP)
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    device = [e for e in events if e.get("cat") in DEVICE]
    kept = [e for e in device if e["args"].get("correlation") in launched]
    dev = analyze_table(load_trace(DATA / f"{ONE_STEP}.json.gz")).device
    assert dev.window.rule == "launched in the trace (one ProfilerStep)"
    assert (dev.window.device_events, dev.window.excluded_events) == (len(kept), len(device) - len(kept)) == (1054, 463)
    tracelens_ms = {"total_time": 33.13133349609375, "busy_time": 29.743927734375, "idle_time": 3.38740576171875,
                    "computation_time": 29.74316796875, "total_memcpy_time": 0.000759765625}
    t = dev.temporal
    mine = {"total_time": t.span_us, "busy_time": t.busy_us, "idle_time": t.idle_us, "computation_time": t.compute_us,
            "total_memcpy_time": t.memory_us}
    assert {k: round(v / 1e3, 6) for k, v in mine.items()} == {k: round(v, 6) for k, v in tracelens_ms.items()}


def test_gemm_flops_and_times_from_recorded_shapes_are_tracelens() -> None:
    """The same trace's GEMMs as TraceLens reports them (reference/mi300_perf_report_csvs/GEMM.csv: GFLOPs of the
    first call, summed kernel time in us, calls). aten::addmm differs by the bias: TraceLens adds M x N
    additions, lmprof counts what FlopCounterMode counts (2 M N K), the truth the rest of lmprof's FLOPs meet."""
    rows = analyze_table(load_trace(DATA / f"{ONE_STEP}.json.gz")).op_flops.rows
    mine = {(r.name, str(r.shapes)): r for r in rows}
    tracelens = [  # name, Input Dims, GFLOPs, kernel time us, calls
        ("aten::mm", "[[8944, 1024], [1024, 2816]]", 51.581550592, 5308.2734375, 48),
        ("aten::mm", "[[8944, 2816], [2816, 1024]]", 51.581550592, 2374.7939453125, 24),
        ("aten::addmm", "[[1024], [8944, 1024], [1024, 1024], [], []]", 18.766086144, 2954.7626953125, 72),
    ]
    for name, dims, gflops, time_us, calls in tracelens:
        r = mine[(name, dims)]
        bias = 8944 * 1024 if name == "aten::addmm" else 0
        assert (r.count, r.flops + bias) == (calls, round(gflops * 1e9))
        # TraceLens sums in float32 (2374.7939453125 is one; 24 float32 additions drift ~1 ns), lmprof in float64
        assert r.time_us == pytest.approx(time_us, abs=2e-3)


# TraceLens' ops_summary.csv of the same trace (tests/traces/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005_perf_report_csvs/):
# each operator's direct kernel time, us (float32 sums)
TRACELENS_OP_KERNEL_US = {
    "aten::mm": 8663.615234375, "aten::mul": 4541.28857421875, "aten::_flash_attention_forward": 3908.79833984375,
    "aten::copy_": 3190.6943359375, "aten::addmm": 2954.7626953125, "aten::add": 1895.603515625,
    "aten::cat": 1356.06982421875, "aten::pow": 928.080078125, "aten::silu": 777.642578125,
    "aten::mean": 619.05224609375, "aten::neg": 517.09814453125, "aten::rsqrt": 215.44775390625,
    "aten::fill_": 107.544921875, "aten::bmm": 27.341796875, "aten::index_select": 21.0078125,
    "aten::eq": 5.57177734375, "aten::cos": 4.68994140625, "aten::sin": 4.2490234375, "aten::all": 2.3251953125,
    "aten::arange": 2.2841796875, "aten::_local_scalar_dense": 0.759765625,
}


def test_each_operators_kernels_are_the_ones_tracelens_links_to_it(tmp_path: Path, cli) -> None:
    """Kernels linked to the operator that launched them (runtime call -> operator), summed per operator, in the
    exported kernels table (`--export`, the kernels in the device figures): TraceLens' per-operator direct kernel
    time of the same trace, all 21 operators that launched kernels, within its float32 rounding."""
    import pyarrow.parquet as pq

    code, _, err = cli("analyze", str(DATA / f"{ONE_STEP}.json.gz"), "--export", str(tmp_path / "tables"))
    assert code == 0, err
    kernels = pq.read_table(tmp_path / "tables" / "kernels.parquet").to_pylist()
    mine: dict[str, float] = {}
    for k in kernels:
        if k["in_device_figures"] and k["op_name"]:
            mine[k["op_name"]] = mine.get(k["op_name"], 0.0) + k["dur_us"]
    assert mine.keys() == TRACELENS_OP_KERNEL_US.keys()
    for name, us in TRACELENS_OP_KERNEL_US.items():
        assert mine[name] == pytest.approx(us, abs=5e-3), name

