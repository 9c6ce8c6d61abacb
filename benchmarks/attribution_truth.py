"""Per-block attribution against an independent truth: a device-synchronised stopwatch around each block.

The truth: during lmprof's own clean steps (scopes off, profiler off) every block is timed with
perf_counter, the device synchronised before and after it, in the same process and run as lmprof's
figures, so machine drift between runs cannot pass for attribution error. The built-in GPT's blocks
are its ``scope(...)`` statements (tests/block_stopwatch.py ``injected``, through
lmprof.workloads.blocks.scope_hook); a Hugging Face model's are the modules lmprof's hooks would scope
(``module_stopwatch``, global module hooks). Per block: the median per step (training forward) or per
generation (decode phase). Each row shows lmprof's block time, the stopwatch's, the error and
whether lmprof's own rule (lmprof.analysis.block_truth: +-10%, matmul blocks +-5%) marks it uncertain.
"before" re-reconciles the same run's trace the old way (mean parts under the profiler, one factor).

    .venv/bin/python benchmarks/attribution_truth.py [--presets tiny,small] [--modes train,decode]
        [--hf-config tiny-gpt2] [--device auto] [--steps 30]

Run it on a quiet machine; ``--smoke`` runs two steps of each case only to check that it runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from block_stopwatch import Truth, injected, module_stopwatch

from lmprof.analysis.block_truth import MATMUL_BLOCKS, error_pct, goal_pct, mark_uncertain
from lmprof.config import InferConfig, TrainConfig
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.infer import run_inference
from lmprof.pipeline.train import run_training
from lmprof.record.run import Run
from lmprof.trace.attribution import attribute
from lmprof.trace.load import load_trace

SETTINGS = {  # preset -> (train batch, train seq, infer prompt, new tokens)
    "tiny": (8, 64, 32, 16),
    "small": (4, 128, 32, 16),
    "hf": (4, 64, 32, 16),
}
Case = tuple[dict[str, float], dict[str, float], dict[str, float], Run]


def _before(run: Run, folder: Path, phase: str, clean: float) -> dict[str, float]:
    att = attribute(load_trace(folder / "trace.json.gz"))
    total = att.total_us() or 1.0
    return {p.name: p.us * clean / total for p in att.parts if p.phase == phase}


def measure_train(preset: str | None, hf: str | None, device: str, out: Path, steps: int, warmup: int,
                  profile: int) -> Case:
    """(stopwatch, lmprof, before) ms per forward block per step, and the run."""
    b, t, _, _ = SETTINGS["hf" if hf else preset or "tiny"]
    sync = resolve_device(device).synchronize
    cfg = TrainConfig(preset=preset or "tiny", hf_config=hf, batch_size=b, seq_len=t, energy="off", plots=False,
                      steps=steps, warmup=warmup, profile_steps=profile, device=device, out=str(out))
    if hf:
        truth = Truth("")
        with module_stopwatch(truth, sync):
            run, folder = run_training(cfg)
    else:
        truth = Truth("embedding")
        with injected("", None, truth, sync):
            run, folder = run_training(cfg)
    true_ms = truth.block_ms(skip=cfg.warmup)
    after = {blk.name: blk.time_ms for blk in run.blocks if blk.phase == "forward"}
    return true_ms, after, _before(run, folder, "forward", run.value("step_time") or 0.0), run


def measure_decode(preset: str, device: str, out: Path, steps: int, warmup: int, profile: int) -> Case:
    """(stopwatch, lmprof, before) ms per decode block per generation, and the run."""
    _, _, prompt, new = SETTINGS[preset]
    truth = Truth("embedding", phase="decode")
    icfg = InferConfig(preset=preset, prompt_len=prompt, new_tokens=new, energy="off", plots=False,
                       steps=steps, warmup=warmup, profile_steps=profile, device=device, out=str(out))
    with injected("", None, truth, resolve_device(device).synchronize):
        run, folder = run_inference(icfg)
    per_step = truth.steps[icfg.warmup * (new - 1):]
    gens = [per_step[i:i + new - 1] for i in range(0, len(per_step) - new + 2, new - 1)][:icfg.steps]
    names = {k for s in per_step for k in s}
    true_ms = {k: statistics.median(sum(s.get(k, 0.0) for s in g) for g in gens) * 1e3 for k in names if gens}
    after = {blk.name: blk.time_ms for blk in run.blocks if blk.phase == "decode"}
    return true_ms, after, _before(run, folder, "decode", run.value("e2e_latency") or 0.0), run


def report(title: str, case: Case, phase: str) -> None:
    """Print each block's lmprof time, stopwatch time, error and lmprof's uncertain mark."""
    truth, after, before, run = case
    marked = {b.name: b for b in mark_uncertain(run.blocks, {(k, phase): v for k, v in truth.items()})
              if b.phase == phase}
    print(f"\n{title}")
    print(f"  {'block':<16}{'stopwatch ms':>14}{'lmprof ms':>11}{'error':>8}{'goal':>6}{'before ms':>11}{'error':>8}"
          "  lmprof marks")
    worst = worst_mm = worst_b = 0.0
    for name in sorted(truth, key=lambda k: -truth[k]):
        tr, a, bf = truth[name], after.get(name, 0.0), before.get(name, 0.0)
        if tr <= 0:
            continue
        err, errb = error_pct(a, tr), error_pct(bf, tr)
        worst, worst_b = max(worst, abs(err)), max(worst_b, abs(errb))
        if name in MATMUL_BLOCKS:
            worst_mm = max(worst_mm, abs(err))
        mark = "uncertain" if name in marked and marked[name].uncertain else ""
        print(f"  {name:<16}{tr:>14.3f}{a:>11.3f}{err:>+7.1f}%{goal_pct(name):>5g}%{bf:>11.3f}{errb:>+7.1f}%  {mark}")
    print(f"  worst block {worst:.1f}% (goal 10%; before {worst_b:.1f}%), worst matmul block {worst_mm:.1f}% (goal 5%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--modes", default="train,decode")
    ap.add_argument("--hf-config", default="tiny-gpt2", help="a Hugging Face architecture ('' to skip)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="two steps of each case: checks that it runs")
    args = ap.parse_args()
    steps, warmup, profile = (2, 1, 1) if args.smoke else (args.steps, 3, 5)
    with tempfile.TemporaryDirectory() as tmp:
        for preset in [p for p in args.presets.split(",") if p]:
            for mode in args.modes.split(","):
                if mode == "train":
                    case = measure_train(preset, None, args.device, Path(tmp), steps, warmup, profile)
                    report(f"{preset} train (forward, per step)", case, "forward")
                elif mode == "decode":
                    case = measure_decode(preset, args.device, Path(tmp), max(steps // 3, 2), min(warmup, 1), profile)
                    report(f"{preset} decode (per generation)", case, "decode")
        if args.hf_config:
            case = measure_train(None, args.hf_config, args.device, Path(tmp), steps, warmup, profile)
            report(f"{args.hf_config} (Hugging Face) train (forward, per step)", case, "forward")


if __name__ == "__main__":
    main()
