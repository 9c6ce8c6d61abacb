"""Overhead of `lmprof run` on the steps outside its profiled window (goal: under 1%).

    .venv/bin/python benchmarks/run_overhead.py [--steps 60] [--rounds 5] [--width 128] [--threads 1]

A training script (a small GPT-2-shaped MLP stack, its own loop and stopwatch) runs alternately
plain and under `lmprof run` (in this process, as the CLI does), ``--rounds`` times each. The
script's own per-step times are compared, step index by step index:

* clean window: the steps lmprof times (its optimizer hook and a device sync at each boundary);
* after the window: the steps after the run is written (lmprof's hooks removed).

And the figure lmprof reports, its clean step time, against the plain script's own stopwatch over
the same steps: lmprof's own work at each boundary must be in neither (its error, in %).

Also printed: the cost of lmprof's hook alone, from timing 10,000 optimizer steps (7 alternated rounds, fastest of each) of a 1-parameter
model with and without a session watching (a figure that machine noise barely moves).
Not a test: timings depend on the machine; run it on a quiet one.
"""
from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.triggers import OptimizerTrigger
from lmprof.pipeline.usercode.script import run_script

SCRIPT = """
import json, sys, time
import torch
from torch import nn
torch.manual_seed(0)
steps, out, width = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
model = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                        for _ in range(4)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ends = []
for _ in range(steps):
    x = torch.randn(8, 32, width)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    ends.append(time.perf_counter())
json.dump([b - a for a, b in zip(ends, ends[1:])], open(out, "w"))
"""

W, S, P = 3, 10, 3  # lmprof run's defaults


def _plain(script: Path, args: list[str]) -> None:
    old = sys.argv[:]
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = old


def _hook_cost(n: int = 10_000) -> tuple[float, float]:
    """Seconds per optimizer step of a 1-parameter model: without and with a session's hook."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    p.grad = torch.zeros(1)

    def loop() -> float:
        t = time.perf_counter()
        for _ in range(n):
            opt.step()
        return (time.perf_counter() - t) / n

    bare, watched = [], []
    for _ in range(7):  # alternated, so a change in machine load hits both
        bare.append(loop())
        session = Session(Spec(warmup=10**9, verbose=False, report=False))  # stays in warm-up
        OptimizerTrigger(session).install()
        try:
            opt.step()  # the first step finds the model (a one-off gc scan), outside the timed loop
            watched.append(loop())
        finally:
            session.finish("benchmark done")
    return min(bare), min(watched)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        plain: list[list[float]] = []
        watched: list[list[float]] = []
        reported: list[float] = []  # lmprof's clean step time, ms
        for r in range(args.rounds):
            out = root / f"plain{r}.json"
            _plain(script, [str(args.steps), str(out), str(args.width)])
            plain.append(json.loads(out.read_text()))
            out = root / f"lmprof{r}.json"
            spec = Spec(out=root / "runs", label="bench", verbose=False, report=False)
            result = run_script(str(script), [str(args.steps), str(out), str(args.width)], spec)
            assert result.exit_code == 0 and result.session.run is not None, result.session.message
            watched.append(json.loads(out.read_text()))
            reported.append(result.session.run.metrics["step_time"].value)
    # diffs[i] is step i + 2; lmprof's clean steps are W+1..W+S, the window ends at step W+S+1+P and
    # the step after it also carries the run's writing.
    clean = slice(W - 1, W + S - 2)  # steps W+1..W+S-1 (step W+S also holds the profiler's start)
    after = slice(W + S + P + 1, None)
    print(f"script: 4 x MLP(width {args.width}) on (8, 32, {args.width}), {args.steps} steps, "
          f"{args.rounds} rounds plain and under lmprof run, {torch.get_num_threads()} threads")
    print(f"{'steps':26s} {'plain ms':>10s} {'lmprof run ms':>14s} {'overhead':>9s}")
    step = statistics.median(x for run in plain for x in run)
    for name, part in (("clean window (timed)", clean), ("after the window", after)):
        a = statistics.median(x for run in plain for x in run[part])
        b = statistics.median(x for run in watched for x in run[part])
        print(f"{name:26s} {a * 1e3:10.2f} {b * 1e3:14.2f} {100 * (b - a) / a:8.2f}%")
    truth = statistics.median(x for run in plain for x in run[clean]) * 1e3
    told = statistics.median(reported)
    print(f"{'step time lmprof reports':26s} {truth:10.2f} {told:14.2f} {100 * (told - truth) / truth:8.2f}%"
          "   (plain: the script's stopwatch, lmprof: run.json's step_time, median of the rounds)")
    bare, hooked = _hook_cost()
    print(f"lmprof's optimizer hook alone: {(hooked - bare) * 1e6:.2f} us per step "
          f"(optimizer step {bare * 1e6:.2f} us bare, {hooked * 1e6:.2f} us watched) = "
          f"{100 * (hooked - bare) / step:.4f}% of this script's plain step")


if __name__ == "__main__":
    main()
