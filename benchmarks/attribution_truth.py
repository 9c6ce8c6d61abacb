"""Per-block attribution against an independent truth: a stopwatch around each forward block.

The truth: the built-in GPT is run with every ``scope(...)`` replaced by a perf_counter stopwatch,
profiler off, for the same config, and each block's median time per step (training forward) or per
generation (decode phase) is taken. lmprof's figure: a normal ``lmprof train`` / ``lmprof infer``
run of the same config. "before" re-reconciles that same run's trace the old way (one factor,
clean step / profiled step, no per-event correction), so both columns come from one trace.

    .venv/bin/python benchmarks/attribution_truth.py [--presets tiny,small] [--modes train,decode]

Run it on a quiet machine: the stopwatch and lmprof's clean window are both wall-clock figures.
Goal (issue 13): every block within +-10% of the stopwatch, matmul blocks within +-5%.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch

import lmprof.workloads.gpt as gpt_module
import lmprof.workloads.inference as inference_module
from lmprof.config import InferConfig, TrainConfig
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.infer import run_inference
from lmprof.pipeline.train import run_training
from lmprof.trace.attribution import attribute
from lmprof.trace.load import load_trace
from lmprof.workloads.builders import infer_workload, train_workload
from lmprof.workloads.inference import generate
from lmprof.workloads.training import TrainStep

MATMUL_BLOCKS = {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"}
SETTINGS = {  # preset -> (train batch, train seq, infer prompt, new tokens)
    "tiny": (8, 64, 32, 16),
    "small": (4, 128, 32, 16),
}


class Stopwatch:
    """Replaces lmprof's scope(): accumulates wall time per block in the current phase."""

    def __init__(self) -> None:
        self.phase = "forward"
        self.totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] += time.perf_counter() - t

    @contextlib.contextmanager
    def step_scope(self, name: str) -> Iterator[None]:
        before, self.phase = self.phase, name
        try:
            yield
        finally:
            self.phase = before

    def take(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for s in samples for k in s}
    return {k: statistics.median(s.get(k, 0.0) for s in samples) * 1e3 for k in keys}


def truth_train(preset: str, steps: int) -> dict[str, float]:
    b, t, _, _ = SETTINGS[preset]
    cfg = TrainConfig(preset=preset, batch_size=b, seq_len=t, energy="off", plots=False)
    work, _ = train_workload(cfg, resolve_device("cpu"))
    step = TrainStep(work, "fp32")
    watch = Stopwatch()
    samples = []
    with _patched(watch):
        for _ in range(3):
            step()
        watch.take()
        for _ in range(steps):
            step()
            samples.append(watch.take())
    return _medians(samples)


def truth_decode(preset: str, gens: int) -> dict[str, float]:
    _, _, prompt, new = SETTINGS[preset]
    cfg = InferConfig(preset=preset, prompt_len=prompt, new_tokens=new, energy="off", plots=False)
    work, _ = infer_workload(cfg, resolve_device("cpu"))
    watch = Stopwatch()
    samples = []
    with torch.inference_mode(), _patched(watch, decode_only=True):
        generate(work)
        watch.take()
        for _ in range(gens):
            generate(work)
            samples.append(watch.take())
    return _medians(samples)


@contextlib.contextmanager
def _patched(watch: Stopwatch, decode_only: bool = False) -> Iterator[None]:
    def scope(name: str) -> contextlib.AbstractContextManager[None]:
        if decode_only and watch.phase != "decode":
            return contextlib.nullcontext()
        return watch.scope(name)

    old_scope, old_step = gpt_module.scope, inference_module.step_scope
    gpt_module.scope, inference_module.step_scope = scope, watch.step_scope  # type: ignore[assignment]
    try:
        yield
    finally:
        gpt_module.scope, inference_module.step_scope = old_scope, old_step


def lmprof_blocks(mode: str, preset: str, out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(after, before) ms per forward/decode block from one lmprof run of the same config."""
    b, t, prompt, new = SETTINGS[preset]
    if mode == "train":
        run, folder = run_training(TrainConfig(preset=preset, batch_size=b, seq_len=t, energy="off", plots=False,
                                               steps=20, profile_steps=5, out=str(out)))
        phase, clean = "forward", run.value("step_time")
    else:
        run, folder = run_inference(InferConfig(preset=preset, prompt_len=prompt, new_tokens=new, energy="off",
                                                plots=False, steps=10, profile_steps=5, out=str(out)))
        phase, clean = "decode", run.value("e2e_latency")
    after = {b.name: b.time_ms for b in run.blocks if b.phase == phase}
    # The old method, on the same trace: mean parts under the profiler, scaled by one factor.
    att = attribute(load_trace(folder / "trace.json.gz"))
    total = att.total_us() or 1.0
    before = {p.name: p.us * (clean or 0.0) / total for p in att.parts if p.phase == phase}
    return after, before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--modes", default="train,decode")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            for mode in args.modes.split(","):
                truth = truth_train(preset, args.steps) if mode == "train" else truth_decode(preset, args.steps // 3)
                after, before = lmprof_blocks(mode, preset, Path(tmp))
                print(f"\n{preset} {mode} ({'forward, per step' if mode == 'train' else 'decode, per generation'})")
                print(f"  {'block':<14}{'stopwatch ms':>14}{'lmprof ms':>11}{'error':>8}{'before ms':>11}{'error':>8}")
                worst = worst_mm = 0.0
                for name in sorted(truth, key=lambda k: -truth[k]):
                    tr, a, bf = truth[name], after.get(name, 0.0), before.get(name, 0.0)
                    err, errb = 100 * (a - tr) / tr, 100 * (bf - tr) / tr
                    worst = max(worst, abs(err))
                    if name in MATMUL_BLOCKS:
                        worst_mm = max(worst_mm, abs(err))
                    print(f"  {name:<14}{tr:>14.3f}{a:>11.3f}{err:>+7.1f}%{bf:>11.3f}{errb:>+7.1f}%")
                print(f"  worst block {worst:.1f}% (goal 10%), worst matmul block {worst_mm:.1f}% (goal 5%)")


if __name__ == "__main__":
    main()
