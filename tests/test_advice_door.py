"""Advice names the knob of the way the run was made, cites only blocks the run has, advises on the
phase that holds the time, and does not call blocks overhead-bound on a noisy run's times.

Truths: the knobs are checked against each tool's own definition — the fields of transformers'
TrainingArguments and Lightning's precision values read from their installed sources (parsed, not
imported: importing them costs seconds), and `lmprof train` / `infer` / `run`'s own options; the
phase shares and bounds are arithmetic on hand-chosen block times.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from lmprof.analysis.advice import advise
from lmprof.analysis.doors import DOORS, door_of
from lmprof.record.run import Block, Env, Metric, OpStat, Run
from lmprof.show.summary import render_text


def blk(name: str, phase: str, ms: float, flops: float | None = None, nbytes: float | None = None) -> Block:
    return Block(name=name, phase=phase, time_ms=ms, profiled_ms=ms, pct=ms, flops=flops, bytes=nbytes)


def metric(v: float, unit: str, spread: float = 0.0) -> Metric:
    return Metric(value=v, unit=unit, source="measured", p10=v * (1 - spread), p90=v * (1 + spread), n=10)


# One training run on which most rules fire: a written-out attention, matmul blocks far from the peak,
# many small operators, the model's own Python, a large optimizer step, a wide spread, a big overhead.
TRAIN_BLOCKS = [blk("attn.qkv", "forward", 15), blk("mlp.fc", "forward", 15), blk("mlp.proj", "backward", 15),
                blk("attn.scores", "forward", 6), blk("attn.softmax", "forward", 2), blk("attn.av", "forward", 2),
                blk("model_glue", "forward", 22), blk("optimizer", "step", 20)]
TRAIN_OPS = [OpStat(name="aten::add", calls=1500, self_ms=5.0, total_ms=5.0, self_pct=50),
             OpStat(name="aten::mm", calls=500, self_ms=3.0, total_ms=3.0, self_pct=30)]


def train_run(config: dict[str, Any], device: str = "cpu") -> Run:
    env: dict[str, Any] = dict(device=device, device_name="d", torch="2", python="3", lmprof="0", os="l", cpu="c",
                               threads=1)
    if device != "cpu":
        env["gpu_memory_bytes"] = 80e9
    return Run(id="r", mode="train", created="2026-01-01T00:00:00Z", env=Env(**env), config=config,
               metrics={"step_time": metric(10.0, "ms", 0.4), "profiled_step_time": metric(10.0, "ms"),
                        "profiler_overhead": Metric(value=45.0, unit="%", source="derived"),
                        "mfu": Metric(value=12.0, unit="%", source="derived"),
                        "memory.peak": Metric(value=2e9, unit="B", source="measured")},
               blocks=TRAIN_BLOCKS + ([blk("idle", "step", 30)] if device != "cpu" else []), ops=TRAIN_OPS)


DOOR_CONFIGS = {
    "lmprof train": {"preset": "tiny", "batch_size": 8, "dtype": "fp32"},
    "the Hugging Face Trainer": {"source": "TrainerCallback", "model_name": "GPT2LMHeadModel", "dtype": "fp32"},
    "the Lightning Trainer": {"source": "LightningCallback", "model_name": "Net", "dtype": "fp32"},
    "lmprof run": {"source": "user code", "script": "train.py", "dtype": "fp32"},
    "lmprof.profile()": {"source": "lmprof.profile", "dtype": "fp32"},
    "lmprof.profile_training()": {"source": "lmprof.profile_training", "dtype": "fp32"},
}


def all_advice(config: dict[str, Any]) -> str:
    recs = advise(train_run(config)) + advise(train_run(config, device="cuda:0"))
    fired = {r.rule for r in recs}
    assert {"attention_unfused", "overhead_bound", "framework_overhead", "low_mfu", "optimizer_share",
            "memory_headroom", "noisy_timing", "profiler_overhead"} <= fired, fired
    return "\n".join(a for r in recs for a in r.actions)


def _source(module: str, relative: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module} is not installed")
    return (Path(spec.origin).parent / relative).read_text(encoding="utf-8")


def _dataclass_fields(source: str, cls: str) -> set[str]:
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _options(verb: str) -> set[str]:
    from lmprof.cli.app import app
    from lmprof.cli.main import _register_verbs

    _register_verbs()
    command = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


LMPROF_FLAGS = re.compile(r"--(?:dtype|compile|batch-size|seq-len|attention|compile-mode)\b")


@pytest.mark.parametrize("door", list(DOOR_CONFIGS))
def test_each_door_gets_its_own_knobs(door: str) -> None:
    config = DOOR_CONFIGS[door]
    assert door_of(train_run(config)).name == door
    text = all_advice(config)
    if door == "lmprof train":
        for flag in re.findall(r"--[a-z][a-z-]*", text):
            if "lmprof roofline" not in text.split(flag)[0].rsplit("\n", 1)[-1]:
                assert flag in _options("train"), flag
        assert "--dtype bf16" in text and "--compile" in text and "--attention sdpa" in text
        return
    # Anything but lmprof train: none of lmprof train's flags, which the user has no way to pass.
    assert not LMPROF_FLAGS.findall(text), LMPROF_FLAGS.findall(text)
    if door == "the Hugging Face Trainer":
        fields = _dataclass_fields(_source("transformers", "training_args.py"), "TrainingArguments")
        named = set(re.findall(r"TrainingArguments\(([a-z0-9_]+)=", text))
        named |= set(re.findall(r"TrainingArguments\([a-z0-9_]+=[^,)]+, ([a-z0-9_]+)=", text))
        assert {"bf16", "torch_compile", "per_device_train_batch_size", "optim", "torch_compile_mode"} <= named
        assert named <= fields, named - fields
        assert 'optim="adamw_torch_fused"' in text and '"adamw_torch_fused"' in _source("transformers", "training_args.py")
        assert "TrainerCallback(steps=" in text
    elif door == "the Lightning Trainer":
        precision = re.search(r'Trainer\(precision="([^"]+)"\)', text)
        assert precision is not None
        allowed = _source("lightning_fabric", "plugins/precision/precision.py")
        assert f'"{precision.group(1)}"' in allowed.split("_PRECISION_INPUT_STR = Literal[", 1)[1].split("]", 1)[0]
        assert "torch.compile(model)" in text and "LightningCallback(steps=" in text
    else:  # the user's own code
        assert "torch.compile(model)" in text and ("torch.bfloat16" in text or 'dtype="bf16"' in text)
        if door == "lmprof run":
            steps = re.findall(r"lmprof run (--[a-z-]+) N (--[a-z-]+) N", text)
            assert steps and set(steps[0]) <= _options("run")
        elif door == "lmprof.profile()":
            assert "lmprof.profile(model, steps=" in text
        else:  # the function's own arguments
            import inspect

            import lmprof

            params = inspect.signature(lmprof.profile_training).parameters
            named = set(re.findall(r"lmprof\.profile_training\(\.\.\., ([a-z_]+)=", text))
            assert named == {"dtype", "steps"} and named <= set(params) and "warmup" in params


def test_lmprof_infer_flags_exist() -> None:
    opts = _options("infer")
    door = DOORS["infer"]
    for knob in (door.bf16, door.compile, door.batch, door.sdpa, door.cuda_graphs):
        for flag in re.findall(r"--[a-z][a-z-]*", knob):
            assert flag in opts, flag


def test_a_bf16_run_is_not_told_to_use_bf16() -> None:
    text = "\n".join(a for r in advise(train_run({"preset": "tiny", "dtype": "bf16"})) for a in r.actions)
    assert "--dtype bf16" not in text


# -- blocks the run has; the phase that holds the time ---------------------------------------------------


def _infer(blocks: list[Block], roof: list[dict[str, Any]], noisy: bool, metrics: dict[str, float]) -> Run:
    run = Run(id="g", mode="infer", created="2026-01-01T00:00:00Z",
              env=Env(device="cpu", device_name="d", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=2),
              config={"preset": "tiny", "batch_size": 1, "prompt_len": 6, "new_tokens": 50},
              metrics={k: Metric(value=v, unit="%" if "mbu" in k else "FLOP/s" if "flops" in k else "B/s",
                                 source="estimated") for k, v in metrics.items()},
              blocks=blocks, noisy=noisy, noise=["other processes kept 1.9 of 2 cores busy"] if noisy else [])
    run.tables["roofline"] = roof
    return run


def rows(blocks: list[Block], bound: str) -> list[dict[str, Any]]:
    return [{"name": b.name, "phase": b.phase, "flops": b.flops, "bytes": b.bytes, "bound": bound,
             "intensity": (b.flops or 0) / (b.bytes or 1), "time_s": b.time_ms / 1e3, "achieved_flops_per_s": None,
             "roof_fraction": 0.001 if bound == "overhead-bound" else 0.5} for b in blocks if b.flops]


# The lesson: a 6-token prompt and 50 new tokens. Prefill is 3 ms of a 100 ms generation, almost all
# matmul; decode is 97 ms, 60% matmul. Both are memory-bound at 6 and 1 token per weight read.
PREFILL = [blk("attn.qkv", "prefill", 1.2, 6e6, 2e6), blk("mlp.fc", "prefill", 1.5, 8e6, 2.7e6),
           blk("ln_1", "prefill", 0.3)]
DECODE = [blk("attn.qkv", "decode", 20, 1e6, 2e6), blk("mlp.fc", "decode", 20, 1.3e6, 2.7e6),
          blk("lm_head", "decode", 18, 1e6, 2e6), blk("attn.sdpa", "decode", 20), blk("other", "decode", 19)]


def test_the_phase_that_holds_the_time_gets_the_advice() -> None:
    run = _infer(PREFILL + DECODE, rows(PREFILL + DECODE, "memory-bound"), False, {})
    rec = {r.rule: r for r in advise(run)}["memory_bound"]
    assert rec.title.startswith("The decode step is memory-bound")
    ev = {e.key: e.value for e in rec.evidence}
    assert ev["decode share of the generation's block time"] == pytest.approx(100 * 97 / 100)
    assert ev["blocks[attn.qkv+mlp.fc+lm_head] share of decode"] == pytest.approx(100 * 58 / 97)
    assert "Decode more sequences at once" in " ".join(rec.actions)
    assert "Process more tokens per step" not in " ".join(rec.actions)
    assert not any("moe." in e.key for e in rec.evidence)  # a non-MoE run cites no MoE block


def test_a_memory_bound_phase_of_3_percent_gets_no_advice() -> None:
    run = _infer(PREFILL + DECODE, rows(PREFILL, "memory-bound") + rows(DECODE, "compute-bound"), False, {})
    assert "memory_bound" not in {r.rule for r in advise(run)}


def test_noisy_run_matmuls_are_not_called_overhead_bound() -> None:
    # Noise made every decode matmul take 100x its roofline time: the table says overhead-bound. At
    # 0.5 FLOP/byte against a ridge of 1e12 / 2e10 = 50 FLOP/byte they are memory-bound.
    peaks = {"decode.peak.flops": 1e12, "decode.peak.bandwidth": 2e10, "prefill.peak.flops": 1e12,
             "prefill.peak.bandwidth": 2e10}
    noisy = _infer(PREFILL + DECODE, rows(PREFILL + DECODE, "overhead-bound"), True, peaks)
    recs = {r.rule: r for r in advise(noisy)}
    rec = recs["memory_bound"]
    assert rec.title.endswith("(on noisy timings)") and any("not clean (noisy:" in n for n in rec.notes)
    assert "overhead_bound" not in recs
    text = render_text(noisy)
    table = text[text.index("Roofline"):]
    assert "memory-bound (by intensity; noisy run" in table
    assert not re.search(r"│ overhead-bound\s*$", table, re.M)
    # The same labels on a steady run are the measurement's own: kept.
    steady = _infer(PREFILL + DECODE, rows(PREFILL + DECODE, "overhead-bound"), False, peaks)
    assert "memory_bound" not in {r.rule for r in advise(steady)}
    assert re.search(r"│ overhead-bound\s*$", render_text(steady)[render_text(steady).index("Roofline"):], re.M)


def test_overhead_advice_on_a_noisy_gpu_run_says_the_run_was_noisy() -> None:
    run = train_run(DOOR_CONFIGS["lmprof train"], device="cuda:0")
    run.noisy, run.noise = True, ["other processes kept 1.9 of 2 cores busy during the timed window"]
    rec = {r.rule: r for r in advise(run)}["overhead_bound"]
    assert "noisy" in rec.title and "other processes kept 1.9 of 2 cores busy" in " ".join(rec.notes)
