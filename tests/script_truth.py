"""``lmprof run`` of a script that writes its own truth: the run lmprof wrote and what the script measured."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lmprof.record.run import Run

# A script's opening: a 2-layer GPT-2 with eager attention (FlopCounterMode counts CPU SDPA as nothing), in
# eval mode, as ``m``; json, sys, torch and FlopCounterMode imported.
TINY_GPT2 = """
import copy, json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
from torch.utils.flop_counter import FlopCounterMode
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=256, bos_token_id=0,
                               eos_token_id=0, attn_implementation="eager")).eval()
"""


def run_with_truth(cli: Callable[..., tuple[int, str, str]], tmp_path: Path, script: str, name: str, *args: str,
                   infer: bool = False, warmup: int = 1, steps: int = 2, profile_steps: int = 1) -> tuple[Run, Any]:
    """Run ``script`` (its text) under ``lmprof run`` in this process, without a report; the script gets the
    truth file's path, then ``args``, and writes there the JSON of what it measured itself. Returns the one
    run lmprof wrote and that JSON."""
    path = tmp_path / "script.py"
    path.write_text(script)
    truth, out = tmp_path / f"{name}.json", tmp_path / f"runs-{name}"
    code, _, err = cli("run", *(["--infer"] if infer else []), "--no-report", "--no-plots", "--warmup", str(warmup),
                       "--steps", str(steps), "--profile-steps", str(profile_steps), "--out", str(out), str(path),
                       str(truth), *args)
    assert code == 0, err
    return Run.load(next(out.iterdir())), json.loads(truth.read_text())
