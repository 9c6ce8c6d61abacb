"""What the one definition of e2e_latency changed for `lmprof infer`: the whole generation against the sum
of its forwards' times (what lmprof infer reported before, its decoder's prefill + decode steps).

    .venv/bin/python benchmarks/generation_timing.py [--preset tiny] [--new-tokens 50] [--generations 20]

For each clean generation of one run, both spans come from the same clock marks (pipeline/protocol/
timing.py): e2e is start to end; the old sum is ttft + every decode step; the difference is the loop's
own work outside the forwards (the token list's concatenation, the callbacks). Prints their medians and
the median ratio, measured in the same run. Not a test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from lmprof.config import InferConfig
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.protocol.observed import Known
from lmprof.pipeline.protocol.own_loop import drive_generations, own_session
from lmprof.workloads.builders import infer_workload
from lmprof.workloads.inference import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--new-tokens", type=int, default=50)
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    cfg = InferConfig(preset=args.preset, new_tokens=args.new_tokens, steps=args.generations, warmup=1,
                      profile_steps=1, device=args.device, energy="off")
    device = resolve_device(cfg.device)
    work, _ = infer_workload(cfg, device)
    known = Known(title=args.preset, dtype="fp32", param_dtype="fp32")
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        session = own_session("infer", cfg, Path(tmp), {}, known)
        session.attach(work.model, [], device=device)
        drive_generations(session, lambda on_forward: generate(work, on_forward=on_forward), work.prompt)
        session.abandon()  # only the clean generations' marks are wanted, no run
    gens = session.timings.gens
    e2e = [g.e2e_s * 1e3 for g in gens]
    summed = [(g.prefill_s + sum(g.decode_s)) * 1e3 for g in gens]
    ratio = [a / b for a, b in zip(e2e, summed)]
    print(f"{args.preset}, {args.new_tokens} new tokens, {len(gens)} clean generations on {device}")
    print(f"e2e (start to end)         median {statistics.median(e2e):.3f} ms")
    print(f"ttft + decode steps (old)  median {statistics.median(summed):.3f} ms")
    print(f"e2e / old sum              median {statistics.median(ratio):.4f}  (range {min(ratio):.4f}-{max(ratio):.4f})")


if __name__ == "__main__":
    main()
