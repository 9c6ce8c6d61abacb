"""lmprof's own cost per run: wall time of a tiny training run and of a quick-sweep point (issue 27).

Prints, against the goal of at most 4 s each on 2 CPU cores:

* the wall time of ``lmprof train --preset tiny --steps 3 --warmup 1 --profile-steps 1 --no-report
  --energy off`` (a fresh process, as a user runs it; median of ``--repeats``), and the steps' share
  of it: warm-up + timed steps at the measured clean step time, plus the profiled steps at the
  profiled step time, both from the run's own run.json;
* for reference, the same kind of fresh process that only imports torch, and torch + dynamo (which
  every torch optimizer imports on its first step): the part of the run no lmprof change removes;
* the sweep: ``lmprof sweep SPEC`` (default ``sweeps/quick.yaml``, 16 points) wall time over its
  points (the issue's "a point" figure: 143 s / 16 points before), and the median of the points'
  own durations from results.sqlite. ``--start subprocess`` runs the points the old way (a new
  Python per point) to compare.

Timings mean something only on a quiet machine: nothing else running on its cores.

Usage::

    .venv/bin/python benchmarks/own_cost.py                       # train x3 and the quick sweep
    .venv/bin/python benchmarks/own_cost.py --repeats 1 --spec my-small.yaml   # a smoke run
    .venv/bin/python benchmarks/own_cost.py --no-sweep
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 4.0
TRAIN = ["train", "--preset", "tiny", "--steps", "3", "--warmup", "1", "--profile-steps", "1",
         "--no-report", "--energy", "off"]


def _wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t


def _value(run: dict, key: str) -> float:
    return float(run["metrics"][key]["value"])


def train_cost(repeats: int, work: Path) -> None:
    walls, shares = [], []
    for i in range(repeats):
        out = work / f"train{i}"
        walls.append(_wall([sys.executable, "-m", "lmprof", *TRAIN, "--out", str(out)]))
        run = json.loads(next(out.glob("*/run.json")).read_text())
        steps_s = (1 + 3) * _value(run, "step_time") / 1e3 + 1 * _value(run, "profiled_step_time") / 1e3
        shares.append(steps_s)
    wall = statistics.median(walls)
    steps = statistics.median(shares)
    torch_s = statistics.median(_wall([sys.executable, "-c", "import torch"]) for _ in range(repeats))
    dynamo_s = statistics.median(_wall([sys.executable, "-c", "import torch._dynamo"]) for _ in range(repeats))
    print(f"lmprof {' '.join(TRAIN)}")
    print(f"  wall {wall:.2f} s (median of {repeats}: {', '.join(f'{w:.2f}' for w in walls)}); "
          f"goal <= {GOAL_S:g} s: {'met' if wall <= GOAL_S else 'NOT met'}")
    print(f"  its steps (4 clean + 1 profiled, from run.json): {steps:.2f} s = {100 * steps / wall:.0f}% of the wall time")
    print(f"  for reference, a process that only imports torch: {torch_s:.2f} s; torch + torch._dynamo "
          f"(every torch optimizer imports it): {dynamo_s:.2f} s")


def sweep_cost(spec: Path, start: str, work: Path) -> None:
    out = work / "sweep"
    env = dict(os.environ, LMPROF_SWEEP_START=start)
    wall = _wall([sys.executable, "-m", "lmprof", "sweep", str(spec), "--out", str(out)], env=env)
    with sqlite3.connect(out / "results.sqlite") as db:
        rows = db.execute("SELECT status, duration_s FROM points ORDER BY started").fetchall()
    n = len(rows)
    durations = [float(d) for s, d in rows if d is not None]
    ok = sum(1 for s, _ in rows if s == "ok")
    per_point = wall / max(n, 1)
    print(f"lmprof sweep {spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec} ({start}): "
          f"{n} points ({ok} ok) in {wall:.1f} s")
    print(f"  a point: {per_point:.2f} s (sweep wall / points); goal <= {GOAL_S:g} s: "
          f"{'met' if per_point <= GOAL_S else 'NOT met'}")
    if durations:
        print(f"  points' own durations: median {statistics.median(durations):.2f} s, "
              f"first {durations[0]:.2f} s (starts the fork server), max {max(durations):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="train runs (the median is printed)")
    ap.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "quick.yaml")
    ap.add_argument("--start", choices=["forkserver", "subprocess"], default="forkserver",
                    help="how sweep workers start (subprocess: the old way, for comparison)")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train_cost(args.repeats, Path(tmp))
        if not args.no_sweep:
            sweep_cost(args.spec.resolve(), args.start, Path(tmp))


if __name__ == "__main__":
    main()
