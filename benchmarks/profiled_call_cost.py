"""What lmprof's profiled call costs the user, against a plain torch.profiler around the same call.

    .venv/bin/python benchmarks/profiled_call_cost.py [--tokens 50] [--layers 12] [--width 768]

The lesson's script: one Hugging Face GPT-2-shaped model (random weights, built from its config),
``generate()`` of ``--tokens`` new tokens, each call timed by the script's own stopwatch. Three runs
of it, each in a fresh process:

* plain                the script alone;
* torch.profiler       the same script with ``torch.profiler.profile()`` around one call, as the lesson
                       writes it (the profiler's start and stop, its trace exported, inside the timed call);
* lmprof run --infer   the script unchanged under lmprof; the profiled call is generation
                       warmup + steps + 2 (after lmprof's profiler warm-up generation).

Printed: the user's stopwatch for the profiled call under each, and the ratio lmprof / torch.profiler
(goal of issue 27: at most 1.5x). Not a test: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import json, sys, time
    import torch, transformers
    torch.manual_seed(0)
    tokens, layers, width, calls, out, mode = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                                int(sys.argv[4]), sys.argv[5], sys.argv[6])
    cfg = transformers.GPT2Config(n_layer=layers, n_head=max(width // 64, 1), n_embd=width)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (1, 8))
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        if mode == "torch" and i == calls - 1:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                model.generate(x, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            prof.export_chrome_trace(out + ".trace.json")
        else:
            model.generate(x, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
        times.append(time.perf_counter() - t0)
    json.dump(times, open(out, "w"))
''')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    args = ap.parse_args()
    warmup, steps, profile = 1, 5, 1  # lmprof's inference defaults
    calls = warmup + steps + 1 + profile + 1  # one more after the window: the loop runs on unprofiled
    profiled = warmup + steps + 1  # 0-based index of lmprof's profiled generation
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "lesson.py"
        script.write_text(SCRIPT)
        common = [str(args.tokens), str(args.layers), str(args.width), str(calls)]

        def times(mode: str, lmprof: bool) -> list[float]:
            out = str(Path(tmp) / f"{mode}-{lmprof}.json")
            cmd = ([sys.executable, "-m", "lmprof", "run", "--infer", "--no-report", "--out", str(Path(tmp) / "runs"),
                    str(script)] if lmprof else [sys.executable, str(script)])
            subprocess.run([*cmd, *common, out, mode], check=True, env=env, capture_output=True)
            return list(json.loads(Path(out).read_text()))

        plain = times("plain", False)
        torch_prof = times("torch", False)
        lm = times("plain", True)
    base = min(plain[warmup:])
    print(f"GPT-2 shape: {args.layers} layers, width {args.width}; generate() of {args.tokens} tokens; seconds by "
          "the script's own stopwatch")
    print(f"  plain call (fastest after the first)      {base:8.3f} s")
    print(f"  call under torch.profiler (lesson)        {torch_prof[-1]:8.3f} s  ({torch_prof[-1] / base:.2f}x plain)")
    print(f"  lmprof's profiled call                    {lm[profiled]:8.3f} s  ({lm[profiled] / base:.2f}x plain)")
    print(f"  lmprof's profiler warm-up call            {lm[profiled - 1]:8.3f} s")
    fig = min(2, warmup)  # the figures step is the second warm-up call, or the only one
    print(f"  lmprof's figures call (warm-up call {fig})   {lm[fig - 1]:8.3f} s")
    print(f"  call after lmprof's window                {lm[-1]:8.3f} s")
    ratio = lm[profiled] / torch_prof[-1]
    print(f"ratio lmprof profiled call / torch.profiler call: {ratio:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
