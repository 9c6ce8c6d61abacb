"""Does the noise flag tell a quiet run of short steps from a disturbed one? (issue 49, item 2)

    .venv/bin/python benchmarks/noise_flag.py [--runs 20] [--step-ms 1.0]

A small MLP trained under ``lmprof.profile`` (one torch thread, 2 warm-up, 10 timed and 3 profiled
steps: lmprof's training defaults but 2 warm-up), its input sized so one step takes about
``--step-ms``. ``--runs`` quiet runs, then as many disturbed ones, in which every step under the
profiler spins for as long as it took, so the profiled window runs 2x slower than a quiet one.
Printed: how many of each were flagged noisy (goal: 0 of the quiet, all of the disturbed) and the
reasons given, and how many runs' timed windows were too short for the CPU-time counters to judge
the machine's load (said in a note, never guessed), and in how many the first clean steps were still
warming up (a note with their figures, not noise). Not a test: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def sized_input(step_ms: float) -> torch.Tensor:
    """An input whose training step takes about ``step_ms`` on this machine (the median of 21 steps a size)."""
    import statistics

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = 64
    for _ in range(12):
        x = torch.randn(rows, 64)
        took = []
        for _ in range(26):
            t0 = time.perf_counter()
            _step(model, opt, x)
            took.append((time.perf_counter() - t0) * 1e3)
        median = statistics.median(took[5:])
        if abs(median - step_ms) < 0.1 * step_ms:
            break
        rows = max(1, int(rows * step_ms / max(median, 1e-3)))
    return torch.randn(rows, 64)


def one_run(out: Path, x: torch.Tensor, disturbed: bool) -> tuple[bool, list[str], list[str], float]:
    """One lmprof.profile run; returns (noisy, reasons, notes, clean median step in ms)."""
    import lmprof
    from lmprof.record.run import Run

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with lmprof.profile(model, out=out, warmup=2, steps=10, profile_steps=3, report=False, verbose=False) as prof:
        for _ in range(20):
            t0 = time.perf_counter()
            _step(model, opt, x)
            if disturbed and torch.autograd.profiler._is_profiler_enabled:
                took = time.perf_counter() - t0
                end = time.perf_counter() + took
                while time.perf_counter() < end:  # the step again, as long: a 2x slower profiled window
                    pass
            prof.step()
    if prof.folder is None:
        raise SystemExit(f"no run was written: {prof.run}")
    run = Run.load(prof.folder)
    step = run.metrics["step_time"].value
    return run.noisy, list(run.noise), list(run.notes), float(step) if step is not None else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = sized_input(args.step_ms)
    print(f"input {tuple(x.shape)}: a step of about {args.step_ms:g} ms on this machine")
    with tempfile.TemporaryDirectory(prefix="lmprof-noise-flag-") as tmp:
        for label, disturbed in (("quiet", False), ("2x slower profiled window", True)):
            flagged, too_short, warming, steps = 0, 0, 0, []
            reasons: Counter[str] = Counter()
            for i in range(args.runs):
                noisy, why, notes, step = one_run(Path(tmp) / f"{label[:5]}{i}", x, disturbed)
                flagged += noisy
                steps.append(step)
                too_short += any("too short to judge" in n for n in notes)
                warming += any("still warming up" in n for n in notes)
                reasons.update(r.split(":")[0][:90] for r in why)
            steps.sort()
            print(f"{label}: {flagged} of {args.runs} flagged noisy; clean median step {steps[len(steps) // 2]:.3g} ms "
                  f"(runs {steps[0]:.3g}-{steps[-1]:.3g}); load too short to judge in {too_short}; first steps still "
                  f"warming up (a note, not noise) in {warming}")
            for reason, n in reasons.most_common():
                print(f"    {n} x {reason}")
    print(f"goal: 0 of {args.runs} quiet runs flagged, {args.runs} of {args.runs} disturbed runs flagged")


if __name__ == "__main__":
    main()
