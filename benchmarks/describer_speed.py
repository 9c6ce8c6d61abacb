"""How long `lmprof memory` takes by each path: formulas (no torch) and the describer (tiny, 70B-class).

Issue 45's goals: `lmprof memory --model <known family>` stays torch-free and under 1.5 s; the
describer path under 5 s for a tiny config and under 20 s for a 70B-class config. Each command runs
in a fresh interpreter (what a user waits for, imports included), a few times; the median is printed
with its ratio to the goal, and the formula path's imports are checked for torch.

    .venv/bin/python benchmarks/describer_speed.py [--repeat 3]

Timings are only meaningful on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LMPROF = [sys.executable, "-m", "lmprof.cli.main"]
TINY = {"model_type": "qwen3_next", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
        "max_position_embeddings": 256, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "pad_token_id": 0}
NO_TORCH = ("import sys, runpy; sys.argv = ['lmprof', 'memory', '--model', 'llama-3-70b', '--device', 'h100', "
            "'--json']\ntry:\n    runpy.run_module('lmprof.cli.main', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('TORCH LOADED' if 'torch' in sys.modules else 'torch-free', file=sys.stderr)")


def _time(cmd: list[str], repeat: int) -> tuple[float, str]:
    times, err = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        err = done.stderr
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return statistics.median(times), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from lmprof.estimate.models import known_config

    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny" / "config.json"
        tiny.parent.mkdir()
        tiny.write_text(json.dumps(TINY))
        # A 70B-class dense family the formulas do not know: OLMo 3's layout at Llama-3-70B's sizes.
        big = Path(tmp) / "olmo3-70b" / "config.json"
        big.parent.mkdir()
        big.write_text(json.dumps({**known_config("llama-3-70b"), "model_type": "olmo3"}))
        cases = [
            ("formulas: llama-3-70b (torch-free)", [sys.executable, "-c", NO_TORCH], 1.5),
            ("describer: tiny qwen3_next, train", [*LMPROF, "memory", "--model", str(tiny), "--device", "h100",
                                                   "--seq-len", "64", "--json"], 5.0),
            ("describer: olmo3 at Llama-3-70B sizes, train b1x4096", [*LMPROF, "memory", "--model", str(big),
                                                                    "--device", "h100", "--batch-size", "1",
                                                                    "--seq-len", "4096", "--dtype", "bf16", "--json"],
             20.0),
            ("describer: qwen3-next-80b-a3b, infer b1x4096", [*LMPROF, "memory", "--model", "qwen3-next-80b-a3b",
                                                              "--device", "h100", "--mode", "infer", "--batch-size",
                                                              "1", "--seq-len", "4096", "--dtype", "bf16", "--json"],
             20.0),
            ("describer: qwen3-next-80b-a3b, train b1x4096", [*LMPROF, "memory", "--model", "qwen3-next-80b-a3b",
                                                              "--device", "h100", "--batch-size", "1", "--seq-len",
                                                              "4096", "--dtype", "bf16", "--json"], 20.0),
        ]
        print(f"{'case':<52}{'median s':>10}{'goal s':>8}{'ratio':>8}")
        for label, cmd, goal in cases:
            median, err = _time(cmd, args.repeat)
            print(f"{label:<52}{median:>10.2f}{goal:>8.1f}{median / goal:>8.2f}")
            if "torch-free" in label:
                print(f"  {err.strip().splitlines()[-1] if err.strip() else 'no report'}")


if __name__ == "__main__":
    main()
