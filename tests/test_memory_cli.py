"""``lmprof memory``: the fit check's output, exit codes, and agreement with a real CPU step."""
from __future__ import annotations

import json

import pytest
import torch

from lmprof.cli.main import main
from lmprof.cli.memory import KNOWN_GPUS, device_memory
from lmprof.errors import ConfigError
from lmprof.workloads.gpt import GPT, PRESETS
from lmprof.workloads.training import plain_train_step
from memory_step import measure_step_memory

GIB = 1024**3
BUDGET_GB = 0.05  # a small artificial budget the tiny model crosses around batch 16 at seq 64


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["memory", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _fit_json(capsys: pytest.CaptureFixture[str], batch: int) -> dict:
    code, out, _ = _run(capsys, "--preset", "tiny", "--batch-size", str(batch), "--seq-len", "64",
                        "--device", "cpu", "--memory-gb", str(BUDGET_GB), "--json")
    data = json.loads(out)
    assert code == (0 if data["fits"] else 1)
    return data


def _measured_peak(batch: int) -> int:
    """Peak allocated bytes of a real steady-state CPU training step of the tiny GPT (fp32, AdamW)."""
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (batch, 64))
    y = torch.randint(0, cfg.vocab_size, (batch, 64))

    # like lmprof's own step: the logits die with the forward pass
    step = plain_train_step(model, opt, lambda: (x, y), lambda m, xy: m(*xy)[1])

    measured = measure_step_memory(step, model, opt, "cpu", warmup=1)
    assert measured.peak is not None
    return measured.peak


def test_fit_check_agrees_with_a_real_cpu_step(capsys: pytest.CaptureFixture[str]) -> None:
    budget = int(BUDGET_GB * GIB)
    fits = _fit_json(capsys, 8)
    too_big = _fit_json(capsys, 24)
    assert fits["fits"] and not too_big["fits"]
    best = fits["largest_batch"]
    assert 8 <= best < 24
    # What the check said holds for real steps: the fitting one peaks under the budget, the other over.
    small, large, edge = _measured_peak(8), _measured_peak(24), _measured_peak(best)
    assert small <= budget < large
    assert edge <= budget
    # ... and the estimate is close to the measured peak, not merely on the right side.
    assert abs(small - fits["estimate"]["peak"]) <= 0.02 * small
    assert abs(large - too_big["estimate"]["peak"]) <= 0.02 * large


def test_gpt2_on_h100_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--preset", "gpt2", "--batch-size", "32", "--seq-len", "1024", "--dtype", "bf16",
                        "--device", "h100")
    assert code == 0
    assert "124,439,808 params" in out
    for word in ("params", "grads", "optimizer", "activations", "logits", "temporaries", "peak", "attn.softmax"):
        assert word in out
    assert "NVIDIA H100 SXM5 80GB: 80.00 GiB" in out
    assert "FITS:" in out and "DOES NOT FIT" not in out
    assert "largest batch size that fits:" in out


def test_does_not_fit_exits_1_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--preset", "gpt2", "--batch-size", "64", "--dtype", "fp32", "--device", "t4",
                        "--no-blocks")
    assert code == 1
    assert "DOES NOT FIT" in out
    assert "attn.softmax" not in out  # --no-blocks


def test_infer_mode_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--preset", "tiny", "--mode", "infer", "--batch-size", "2", "--seq-len", "32",
                        "--new-tokens", "8", "--n-layer", "2", "--attention", "sdpa", "--memory-gb", "1", "--json")
    assert code == 0
    est = json.loads(out)["estimate"]
    assert est["shape"]["n_layer"] == 2 and est["attention"] == "sdpa"
    assert est["kv_cache"] == 2 * 2 * 4 * 32 * 40 * 2 * 4  # 2 x L x heads x head_dim x tokens x b x 4 B


@pytest.mark.parametrize(
    "args",
    [
        ["--preset", "nope"],
        ["--batch-size", "0"],
        ["--dtype", "fp64"],
        ["--attention", "flash"],
        ["--device", "z80"],
        ["--device", "a100"],
        ["--memory-gb", "-1"],
        ["--mode", "serve"],
        ["--optimizer", "lion"],
        ["--seq-len", "4096"],  # beyond the tiny preset's block size
        ["--n-head", "3"],  # 128 is not divisible by 3
        ["--batch-size", "many"],  # not an integer: click's own error
    ],
)
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, _, err = _run(capsys, *args)
    assert code == 2
    assert err.startswith("lmprof: error:") and err.count("\n") == 1


def test_device_table() -> None:
    assert device_memory("h100", None) == ("NVIDIA H100 SXM5 80GB", 80 * GIB, "cuda")
    assert device_memory("a100-40", None)[1] == 40 * GIB
    assert device_memory("H200", None)[1] == 141 * 10**9
    assert device_memory("h100", 2.5) == ("2.5 GiB budget", int(2.5 * GIB), "cuda")
    name, ram, kind = device_memory("cpu", None)
    assert kind == "cpu" and ram > 0
    assert all(cap > 0 for _, cap in KNOWN_GPUS.values())
    with pytest.raises(ConfigError):
        device_memory("a100", None)


def test_fit_budget_uses_usable_memory_and_margin(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13 §4: the driver reports 81,559 MiB for an H100 80GB, and a margin is reserved."""
    from lmprof.cli.memory import device_budget

    name, nominal, budget, kind, how = device_budget("h100", None)
    usable = 81_559 * 2**20
    assert nominal == 80 * GIB and kind == "cuda"
    assert budget == int(usable - GIB - 0.02 * usable)  # 1 GiB + 2%, docs/memory.md
    assert "81,559 MiB" in how
    # L4 and T4 from their driver totals; an unrecorded card at 93.75% of nominal.
    assert device_budget("l4", None, margin=False)[2] == 23_034 * 2**20
    assert device_budget("t4", None, margin=False)[2] == 15_360 * 2**20
    assert device_budget("a100-80", None, margin=False)[2] == int(80 * GIB * 0.9375)
    assert device_budget("h100", 10.0)[2] == 10 * GIB  # --memory-gb is the budget as given


def test_model_infer_largest_batch_and_context(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--model", "llama-3-8b", "--mode", "infer", "--context", "4096", "-b", "4",
                        "--device", "h100", "--dtype", "bf16", "--kv-dtype", "fp8", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] and data["params_total"] == 8_030_261_248
    # fp8 KV cache: 2 x 32 layers x 1024 x 4096 tokens x 4 sequences x 1 byte, by hand
    assert data["estimate"]["kv_cache"] == 2 * 32 * 1024 * 4096 * 4
    assert data["largest_batch"] > 4 and 4096 < data["largest_context"] <= 8192


def test_model_train_zero3_divides_static_state(capsys: pytest.CaptureFixture[str]) -> None:
    one = json.loads(_run(capsys, "--model", "mixtral-8x7b", "-b", "1", "--seq-len", "512", "--dtype", "bf16",
                          "--device", "h100", "--json")[1])
    eight = json.loads(_run(capsys, "--model", "mixtral-8x7b", "-b", "1", "--seq-len", "512", "--dtype", "bf16",
                            "--device", "h100", "--gpus", "8", "--shard", "zero3", "--json")[1])
    n = 46_702_792_704
    assert one["params_total"] == n and one["estimate"]["params"] == 2 * n  # bf16
    assert eight["estimate"]["params"] == 2 * n // 8
    assert eight["estimate"]["optimizer_state"] == pytest.approx(one["estimate"]["optimizer_state"] / 8, rel=1e-6)


@pytest.mark.parametrize("args, text", [
    (["--model", "no-such"], "llama-3-8b"),
    (["--model", "llama-3-8b", "--mode", "infer", "--context", "9000"], "8192"),
    (["--model", "llama-3-8b", "--shard", "zero9"], "zero3"),
    (["--model", "llama-3-8b", "--optimizer", "lion"], "adamw8bit"),
])
def test_model_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], text: str) -> None:
    code, _, err = _run(capsys, *args, "--device", "h100")
    assert code == 2 and err.count("\n") == 1 and text in err


def test_checkpointing_keeps_layer_inputs_only(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "llama-3-8b", "-b", "2", "--seq-len", "1024", "--dtype", "bf16", "--device", "h100", "--json"]
    plain = json.loads(_run(capsys, *base)[1])["estimate"]
    ckpt = json.loads(_run(capsys, *base, "--checkpointing")[1])["estimate"]
    once = plain["activations"] - 32 * plain["activations_per_layer"]
    # by hand: 32 layer inputs of 2 x 1024 x 4096 bf16 values, plus the once-per-model tensors
    assert ckpt["activations"] == 32 * 2 * 1024 * 4096 * 2 + once
    assert ckpt["moments"]["end of forward"] == plain["moments"]["end of forward"] - (
        plain["activations"] - ckpt["activations"])
