"""Per-block attribution against an independent truth: a stopwatch around each forward block.

The truth: during lmprof's own clean steps (scopes off, profiler off) every ``scope(...)`` of the
built-in GPT is timed with perf_counter (tests/block_stopwatch.py, installed through
lmprof.workloads.blocks.scope_hook), in the same process and run as
lmprof's figures, so machine drift between runs cannot pass for attribution error. Per block: the
median per step (training forward) or per generation (decode phase). "before" re-reconciles the
same run's trace the old way (mean parts under the profiler, one factor: clean / profiled step).

    .venv/bin/python benchmarks/attribution_truth.py [--presets tiny,small] [--modes train,decode]

Run it on a quiet machine. Goal (issue 13): every block within +-10%, matmul blocks within +-5%.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from block_stopwatch import Truth, injected

from lmprof.config import InferConfig, TrainConfig
from lmprof.pipeline.infer import run_inference
from lmprof.pipeline.train import run_training
from lmprof.trace.attribution import attribute
from lmprof.trace.load import load_trace

MATMUL_BLOCKS = {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"}
SETTINGS = {  # preset -> (train batch, train seq, infer prompt, new tokens)
    "tiny": (8, 64, 32, 16),
    "small": (4, 128, 32, 16),
}


def measure(mode: str, preset: str, out: Path, steps: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(stopwatch, lmprof, before) ms per forward (train) or decode (infer) block, from one run."""
    b, t, prompt, new = SETTINGS[preset]
    if mode == "train":
        truth = Truth("embedding")
        cfg = TrainConfig(preset=preset, batch_size=b, seq_len=t, energy="off", plots=False, steps=steps,
                          warmup=3, profile_steps=5, out=str(out))
        with injected("", None, truth):
            run, folder = run_training(cfg)
        true_ms = truth.block_ms(skip=cfg.warmup)
        phase, clean = "forward", run.value("step_time") or 0.0
    else:
        truth = Truth("embedding", phase="decode")
        icfg = InferConfig(preset=preset, prompt_len=prompt, new_tokens=new, energy="off", plots=False,
                           steps=max(steps // 3, 3), warmup=1, profile_steps=5, out=str(out))
        with injected("", None, truth):
            run, folder = run_inference(icfg)
        per_step = truth.steps[icfg.warmup * (new - 1):]
        gens = [per_step[i:i + new - 1] for i in range(0, len(per_step) - new + 2, new - 1)][:icfg.steps]
        names = {k for s in per_step for k in s}
        true_ms = {k: statistics.median(sum(s.get(k, 0.0) for s in g) for g in gens) * 1e3 for k in names}
        phase, clean = "decode", run.value("e2e_latency") or 0.0
    after = {blk.name: blk.time_ms for blk in run.blocks if blk.phase == phase}
    att = attribute(load_trace(folder / "trace.json.gz"))
    total = att.total_us() or 1.0
    before = {p.name: p.us * clean / total for p in att.parts if p.phase == phase}
    return true_ms, after, before


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--modes", default="train,decode")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            for mode in args.modes.split(","):
                truth, after, before = measure(mode, preset, Path(tmp), args.steps)
                print(f"\n{preset} {mode} ({'forward, per step' if mode == 'train' else 'decode, per generation'})")
                print(f"  {'block':<14}{'stopwatch ms':>14}{'lmprof ms':>11}{'error':>8}{'before ms':>11}{'error':>8}")
                worst = worst_mm = worst_b = 0.0
                for name in sorted(truth, key=lambda k: -truth[k]):
                    tr, a, bf = truth[name], after.get(name, 0.0), before.get(name, 0.0)
                    err, errb = 100 * (a - tr) / tr, 100 * (bf - tr) / tr
                    worst, worst_b = max(worst, abs(err)), max(worst_b, abs(errb))
                    if name in MATMUL_BLOCKS:
                        worst_mm = max(worst_mm, abs(err))
                    print(f"  {name:<14}{tr:>14.3f}{a:>11.3f}{err:>+7.1f}%{bf:>11.3f}{errb:>+7.1f}%")
                print(f"  worst block {worst:.1f}% (goal 10%; before {worst_b:.1f}%), "
                      f"worst matmul block {worst_mm:.1f}% (goal 5%)")


if __name__ == "__main__":
    main()
