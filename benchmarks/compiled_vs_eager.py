"""Eager vs torch.compile on the same workload: per block, time and operators/kernels per step.

Runs the built-in GPT's training step and its generation (prefill + decode) twice each, eager and
``--compile``, with the same preset, seed and sizes, each in a process of its own (no compiled state
carried over), then runs ``lmprof compare`` on each pair and prints, per block, the time before and
after and the operators (eager) or compiled kernels (compiled) it issued per step.

    PYTHONPATH=src python benchmarks/compiled_vs_eager.py              # small preset
    PYTHONPATH=src python benchmarks/compiled_vs_eager.py --quick      # tiny preset, few steps: shows it works

Timings need a quiet machine: the script says nothing about noise beyond what each run records
(run.json ``noisy``); read the compare output's notes and each run's summary before trusting a ratio.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LMPROF = [sys.executable, "-m", "lmprof"]


def run(mode: str, compiled: bool, common: list[str], out: Path) -> Path:
    """One lmprof run into a fresh folder under ``out``; its run folder."""
    dest = out / f"{mode}-{'compiled' if compiled else 'eager'}"
    args = [*LMPROF, mode, *common, "--out", str(dest), "--no-report", "--compile" if compiled else "--no-compile"]
    print("$", " ".join(args[2:]), flush=True)
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{mode} ({'compiled' if compiled else 'eager'}) failed:\n{done.stderr[-2000:]}")
    folders = [p for p in dest.iterdir() if (p / "run.json").is_file()]
    if len(folders) != 1:
        sys.exit(f"expected one run folder in {dest}, found {len(folders)}")
    return folders[0]


def per_block(eager: Path, compiled: Path) -> str:
    """The compare's block rows as a plain table: ms and ops per step, eager then compiled."""
    done = subprocess.run([*LMPROF, "compare", str(eager), str(compiled), "--json"], capture_output=True, text=True,
                          check=True)
    c = json.loads(done.stdout)
    lines = [f"{'block':<14} {'phase':<9} {'eager ms':>9} {'compiled ms':>11} {'speedup':>8} {'eager ops':>9} "
             f"{'compiled ops':>12}"]
    for row in [*c["phases"], *c["blocks"]]:
        t, ops, sp = row["times_ms"], row["ops"] or [None, None], row["speedups"][1]

        def ms(v: float | None) -> str:
            return "—" if v is None else f"{v:.3f}"

        def n(v: float | None) -> str:
            return "—" if v is None else f"{v:.1f}"

        lines.append(f"{row['name']:<14} {row['phase']:<9} {ms(t[0]):>9} {ms(t[1]):>11} "
                     f"{'' if sp is None else f'{sp:.2f}x':>8} {n(ops[0]):>9} {n(ops[1]):>12}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny preset, few steps (checks the script, not timings)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="where the four runs go (default: a temporary folder)")
    ap.add_argument("--seed", default="0")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="lmprof-compiled-vs-eager-"))
    out.mkdir(parents=True, exist_ok=True)
    base = ["--device", a.device, "--seed", a.seed, "--energy", "off"]
    if a.quick:
        train = [*base, "--preset", "tiny", "--n-layer", "1", "--batch-size", "8", "--seq-len", "64",
                 "--steps", "3", "--warmup", "2", "--profile-steps", "2"]
        infer = [*base, "--preset", "tiny", "--prompt-len", "16", "--new-tokens", "8",
                 "--steps", "2", "--warmup", "1", "--profile-steps", "1"]
    else:
        train = [*base, "--preset", "small", "--steps", "20", "--warmup", "5", "--profile-steps", "3"]
        infer = [*base, "--preset", "small", "--prompt-len", "64", "--new-tokens", "64",
                 "--steps", "5", "--warmup", "2", "--profile-steps", "2"]
    for mode, common in (("train", train), ("infer", infer)):
        eager, compiled = run(mode, False, common, out), run(mode, True, common, out)
        print(f"\n=== {mode}: lmprof compare {eager} {compiled}\n", flush=True)
        shown = subprocess.run([*LMPROF, "compare", str(eager), str(compiled)], capture_output=True, text=True)
        print(shown.stdout or shown.stderr)
        print(f"--- {mode}: per block, eager (A) vs compiled (B); ops = operators (eager) or kernels (compiled) "
              "per step\n")
        print(per_block(eager, compiled))
        for label, folder in (("eager", eager), ("compiled", compiled)):
            rec = json.loads((folder / "run.json").read_text())
            if rec.get("noisy"):
                print(f"note: the {label} run is marked noisy: " + "; ".join(rec.get("noise", [])))
    print(f"\nruns in {out}")


if __name__ == "__main__":
    main()
