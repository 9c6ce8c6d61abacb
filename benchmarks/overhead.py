"""Profiler overhead per preset: clean vs profiled step time of `lmprof train`.

    .venv/bin/python benchmarks/overhead.py [--presets tiny,small,gpt2] [--device auto]

Prints one row per preset. Not a test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from lmprof.config import TrainConfig
from lmprof.pipeline.train import run_training

# Small enough to finish on a laptop CPU; the gpt2 row uses a short sequence for the same reason.
SHAPES = {"tiny": (8, 64), "small": (4, 128), "gpt2": (1, 128)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", default="tiny,small,gpt2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    print(f"{'preset':8s} {'batch x seq':>12s} {'clean ms (p10-p90)':>24s} {'profiled ms':>12s} {'overhead':>9s}")
    for name in args.presets.split(","):
        b, t = SHAPES[name]
        cfg = TrainConfig(preset=name, batch_size=b, seq_len=t, steps=args.steps, warmup=3, profile_steps=3,
                          device=args.device, energy="off")
        with tempfile.TemporaryDirectory() as tmp:
            run, _ = run_training(cfg, out_dir=Path(tmp) / "run")
        st, pr, ov = run.metrics["step_time"], run.metrics["profiled_step_time"], run.metrics["profiler_overhead"]
        print(f"{name:8s} {f'{b} x {t}':>12s} {f'{st.value:.2f} ({st.p10:.2f}-{st.p90:.2f})':>24s} "
              f"{pr.value:12.2f} {ov.value:8.1f}%   [{run.env.device}: {run.env.device_name}]")


if __name__ == "__main__":
    main()
