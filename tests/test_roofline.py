"""Roofline classification on hand-made numbers, the PNG, the CLI, and the MFU metrics."""
from __future__ import annotations

import math
import re

import pytest

from lmprof.estimate.flops import model_flops_per_step, phase_costs
from lmprof.estimate.mfu import block_roofline, fill_block_costs, mfu_metrics
from lmprof.estimate.roofline import attainable, classify, ridge_point, roofline_time
from lmprof.cli.main import main
from lmprof.hardware.calibrate import Calibration, Peak, save_calibration
from lmprof.record.run import Block
from lmprof.show.roofline_plot import plot_roofline
from lmprof.estimate.shape import ModelShape

P, W = 100e12, 1e12  # 100 TFLOP/s, 1 TB/s: ridge at 100 FLOP/byte
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("LMPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_ridge_attainable_and_time():
    assert ridge_point(P, W) == 100
    assert attainable(1.0, P, W) == 1e12  # memory slope: I * W
    assert attainable(1000.0, P, W) == P  # flat compute ceiling
    assert attainable(math.inf, P, W) == P
    assert roofline_time(1e9, 1e9, P, W) == 1e-3  # bytes dominate: 1 GB / 1 TB/s


def test_memory_bound_block():
    p = classify("ln", 1e9, 1e9, P, W, time_s=2e-3)  # I = 1, roof 1 TFLOP/s, achieved 0.5
    assert p.bound == "memory-bound" and p.intensity == 1
    assert p.achieved_flops_per_s == 0.5e12 and p.roof_fraction == pytest.approx(0.5)
    assert p.min_time_s == 1e-3


def test_compute_bound_block():
    p = classify("mm", 200e9, 1e9, P, W, time_s=4e-3)  # I = 200 > 100, roof 100 TFLOP/s, achieved 50
    assert p.bound == "compute-bound" and p.attainable_flops_per_s == P
    assert p.roof_fraction == pytest.approx(0.5)


def test_overhead_bound_and_threshold():
    p = classify("tiny", 1e6, 1e6, P, W, time_s=1e-4)  # achieved 10 GFLOP/s vs roof 1 TFLOP/s: 1%
    assert p.roof_fraction == pytest.approx(0.01) and p.bound == "overhead-bound"
    looser = classify("tiny", 1e6, 1e6, P, W, time_s=1e-4, overhead_threshold=0.005)
    assert looser.bound == "memory-bound"
    assert classify("tiny", 1e6, 1e6, P, W, time_s=1e-4 / 20).bound == "memory-bound"  # 20%


def test_analytic_blocks_have_no_overhead_label():
    assert classify("mm", 200e9, 1e9, P, W).bound == "compute-bound"
    assert classify("ln", 1e9, 1e9, P, W).bound == "memory-bound"
    assert classify("ln", 1e9, 1e9, P, W).roof_fraction is None


def test_edge_cases():
    zero = classify("view", 0, 1e6, P, W, time_s=1e-3)  # no FLOPs: fraction from bandwidth alone (0.1%)
    assert zero.intensity == 0 and zero.roof_fraction == pytest.approx(1e-3) and zero.bound == "overhead-bound"
    assert classify("x", 1e9, 1e9, None, None).bound == "unknown"
    with pytest.raises(ValueError):
        classify("x", -1, 1, P, W)
    with pytest.raises(ValueError):
        ridge_point(0, W)


def test_plot_writes_png(tmp_path):
    points = [
        classify("attn.qkv", 200e9, 1e9, P, W, phase="forward"),
        classify("ln_1", 1e9, 1e9, P, W, phase="forward"),
        classify("ln_2", 1e9, 1e9, P, W, phase="forward"),
        classify("view", 0, 1e6, P, W, phase="forward"),
    ]
    out = plot_roofline(points, peak_flops=P, peak_bytes_per_s=W, out=tmp_path / "r.png",
                        device="Test GPU", dtype="bf16", model="tiny", phase="prefill")
    assert out.read_bytes()[:8] == PNG


def test_cli_roofline_gpt2_h100(tmp_path, capsys):
    code = main(["roofline", "--preset", "gpt2", "--device", "h100", "--out", str(tmp_path / "r.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG
    for text in ("attn.qkv", "compute-bound", "memory-bound", "table:h100-sxm", "ridge", "FLOP/B", "conventions"):
        assert text in out


@pytest.mark.parametrize("phase", ["decode", "train"])
def test_cli_roofline_phases(tmp_path, capsys, phase):
    args = ["roofline", "--preset", "tiny", "--device", "a100", "--phase", phase, "--seq-len", "128",
            "--batch-size", "4", "--out", str(tmp_path / "r.png")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "lm_head" in out
    assert bool(re.search(r"mlp\.fc\s+backward", out)) == (phase == "train")


@pytest.mark.parametrize(
    "args",
    [
        ["--device", "no-such-gpu"],
        ["--device", "h100", "--batch-size", "-1"],
        ["--device", "h100", "--phase", "sideways"],
        ["--device", "h100", "--seq-len", "4096"],
        ["--device", "h100", "--dtype", "int3"],
        ["--device", "v100", "--dtype", "bf16", "--sweep-batch", "1,8"],  # a sweep needs the ceilings
        [],
    ],
)
def test_cli_roofline_bad_input(tmp_path, capsys, args):
    assert main(["roofline", "--preset", "gpt2", "--out", str(tmp_path / "r.png"), *args]) == 2
    assert "lmprof: error:" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--device", "cpu"], ["--device", "cpu", "--dtype", "fp32"],
                                  ["--device", "v100", "--dtype", "bf16"]])
def test_cli_roofline_without_ceilings_still_prints_flops_and_bytes(tmp_path, capsys, monkeypatch, args):
    """No calibration cached (the temporary cache) and no table rate: FLOPs, bytes and FLOP/byte need
    no peak, so the table is printed, with why there is no bound, and no plot is written."""
    monkeypatch.chdir(tmp_path)
    assert main(["roofline", "--preset", "tiny", *args]) == 0
    out = capsys.readouterr().out
    assert "roofline ceilings, so no bound or time per block" in out
    assert re.search(r"attn\.qkv\s+4\s+101 M\s+\S+ MB\s+\S+\s+unknown", out), out
    assert "no roofline time without ceilings" in out
    assert not list(tmp_path.iterdir())  # nothing written into the current folder


def test_cli_roofline_writes_no_plot_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["roofline", "--preset", "tiny", "--device", "h100"]) == 0
    assert "wrote" not in capsys.readouterr().out and not list(tmp_path.iterdir())
    assert main(["roofline", "--preset", "tiny", "--device", "h100", "--plot", "p.png"]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG


def test_cli_roofline_cpu_uses_calibration(tmp_path, capsys):
    from lmprof.hardware.devices import cpu_model

    cal = Calibration(device="cpu", device_name=cpu_model(), hostname=__import__("socket").gethostname(),
                      created="2025-01-01T00:00:00+00:00", torch="x", threads=__import__("torch").get_num_threads(),
                      seconds=1.0, matmul={"fp32": {"flops_per_s": 1e11, "size": 256, "n": 3, "by_size": {}}},
                      bandwidth={"bytes_per_s": 1e10, "nbytes": 1, "method": "copy", "n": 3})
    save_calibration(cal)
    code = main(["roofline", "--preset", "tiny", "--device", "cpu", "--dtype", "fp32", "--out", str(tmp_path / "c.png")])
    assert code == 0
    assert "calibrated:" in capsys.readouterr().out


SHAPE = ModelShape(n_layer=4, n_head=4, n_embd=128, vocab_size=65, block_size=256, name="tiny")


def test_mfu_against_table_peak():
    model = model_flops_per_step(SHAPE, batch=8, seq_len=256, mode="train")
    m = mfu_metrics(SHAPE, batch=8, seq_len=256, mode="train", time_s=0.01,
                    device_name="NVIDIA H100 80GB HBM3", device_kind="cuda", dtype="bf16")
    assert m["flops.model_per_step"].value == model and m["flops.model_per_step"].unit == "FLOP"
    assert m["flops.achieved"].value == pytest.approx(model / 0.01)
    assert m["mfu"].value == pytest.approx(100 * model / 0.01 / 989.4e12) and m["mfu"].unit == "%"
    assert m["hfu"].value == m["mfu"].value  # no recomputation by default
    assert "table:h100-sxm" in m["mfu"].note and "HFU == MFU" in m["hfu"].note
    assert m["peak.flops"].value == pytest.approx(989.4e12) and "table:h100-sxm" in m["peak.flops"].note
    assert m["mbu"].value > 0 and m["peak.bandwidth"].value == 3.35e12


def test_hfu_with_full_recompute_adds_a_forward():
    m = mfu_metrics(SHAPE, batch=8, seq_len=256, mode="train", time_s=0.01, device_name="h100",
                    dtype="bf16", recompute="full")
    # training model FLOPs are 3x a forward: with one more forward, hardware FLOPs are 4/3 of them
    assert m["hfu"].value == pytest.approx(m["mfu"].value * 4 / 3)
    assert m["flops.hardware_per_step"].value == pytest.approx(m["flops.model_per_step"].value * 4 / 3)


def test_mfu_na_without_peak_or_time():
    m = mfu_metrics(SHAPE, batch=1, seq_len=64, mode="prefill", time_s=0.01, device_name="Mystery", device_kind="cpu",
                    dtype="fp32")
    assert m["mfu"].value is None and "lmprof calibrate" in m["mfu"].note
    assert m["flops.achieved"].value is not None  # the achieved rate needs no peak
    m = mfu_metrics(SHAPE, batch=1, seq_len=64, mode="decode", time_s=None, device_name="h100", dtype="bf16")
    assert m["mfu"].value is None and m["mfu"].note == "no measured time"
    peak = Peak(flops_per_s=1e12, bytes_per_s=1e11, source="calibrated:x.json", note="measured")
    m = mfu_metrics(SHAPE, batch=1, seq_len=64, mode="decode", decode_tokens=4, time_s=1e-3, device_name="cpu",
                    dtype="fp32", peak=peak)
    assert m["peak.flops"].source == "measured" and m["mfu"].value > 0


def test_fill_blocks_and_block_roofline():
    blocks = [
        Block(name="mlp.fc", phase="forward", time_ms=2.0, profiled_ms=2.5, pct=10.0),
        Block(name="ln_1", phase="forward", time_ms=1.0, profiled_ms=1.2, pct=5.0),
        Block(name="mlp.fc", phase="backward", time_ms=4.0, profiled_ms=5.0, pct=20.0),
        Block(name="optimizer", phase="step", time_ms=3.0, profiled_ms=3.0, pct=15.0),
    ]
    filled = fill_block_costs(blocks, lambda phase: phase_costs(SHAPE, batch=2, seq_len=64, phase=phase,
                                                                   dtype="fp32"))
    fc, ln, fc_b, opt = filled
    assert fc.flops == pytest.approx(4 * (2 * 2 * 64 * 128 * 512 + 2 * 64 * 512))  # matmul + bias adds
    assert fc_b.flops == pytest.approx(2 * fc.flops) and ln.bytes > 0
    assert opt.flops is None and opt.bytes is None
    points = block_roofline(filled, P, W)
    assert [p.name for p in points] == ["mlp.fc", "ln_1", "mlp.fc"]
    assert points[0].time_s == pytest.approx(2e-3)
    assert points[1].bound == "overhead-bound"  # a ~MB of traffic in 1 ms on a 1 TB/s device


def test_cli_decode_kv_length_is_the_one_printed(tmp_path, capsys):
    """Issue 13 §6: `--phase decode -t 64` computes 64 keys (it computed 65); gpt2's default 1,024, not 1,025."""
    from lmprof.estimate.flops import block_costs
    from lmprof.workloads.gpt import preset

    shape = preset("tiny").shape()
    assert main(["roofline", "--preset", "tiny", "--device", "h100", "--phase", "decode", "-t", "64", "--json"]) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    scores = next(b for b in data["blocks"] if b["name"] == "attn.scores")
    # one query per head against 64 keys, 2 FLOPs per multiply-add, every layer: by hand
    assert scores["matmul_flops"] == 2 * 64 * shape.n_embd * shape.n_layer
    assert data["kv_length"] == 64
    ref = block_costs(shape, batch=1, seq_len=1, phase="decode", context=64)
    assert data["total"]["flops"] == pytest.approx(sum(c.flops for c in ref))


@pytest.mark.parametrize("args, text", [
    (["--model", "no-such"], "llama-3-8b"),
    (["--model", "llama-3-8b", "--phase", "decode", "--context", "9000"], "8192"),
    (["--model", "llama-3-8b", "--weights", "int3"], "int4"),
    (["--model", "mistral-7b", "--device", "v100", "--dtype", "bf16", "--sweep-batch", "1,8"], "bf16"),
    (["--model", "qwen2.5-7b", "--sweep-batch", "1,x"], "integers"),
])
def test_cli_roofline_model_bad_input(tmp_path, capsys, args, text):
    argv = ["roofline", "--device", "h100", "--out", str(tmp_path / "r.png"), *args]
    argv = argv if "--device" not in args else ["roofline", "--out", str(tmp_path / "r.png"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmprof: error:") and err.count("\n") == 1 and text in err


def test_cli_roofline_model_sweep_json(capsys):
    assert main(["roofline", "--model", "llama-3-8b", "--device", "h100", "--sweep-batch", "1,64,4096",
                 "--context", "128", "--json"]) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    assert data["params_total"] == 8_030_261_248
    rows = data["sweep"]
    # batch 1 decode reads every matmul weight once (the embedding only its one row): by hand,
    # 2 bytes x 7,504,658,432 / 3.35 TB/s = 4.480 ms, plus a little for norms, activations and KV.
    assert rows[0]["time_s"] == pytest.approx(2 * 7_504_658_432 / 3.35e12, rel=0.01)
    assert rows[0]["bound"] == "memory-bound"
    assert rows[-1]["time_per_token_s"] < rows[0]["time_per_token_s"]
