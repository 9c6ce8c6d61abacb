"""Every causal-LM family through the user-code door: a plain script alone, then under ``lmprof run``.

For each family the installed transformers registers (the tiny config of
``lmprof.measure.model_facts.tiny``, written as a model folder's config.json), two scripts that know
nothing of lmprof run twice each: alone, and under ``lmprof run`` (``--infer`` for the second):

* ``train``: ``AutoModelForCausalLM.from_config``, AdamW, 12 steps of random tokens, prints the last loss;
* ``infer``: 10 greedy ``generate()`` calls of 3 new tokens, prints the last output's shape.

A family passes when, under lmprof, the exit code and stdout are the script's own, lmprof wrote a
run.json, and no traceback shows that the script alone did not print (a script whose own output
differs from one run alone to the next, as Reformer's does, passes on the rest). A script that fails alone must
fail the same way under lmprof (its own traceback, its exit code; what was measured before is kept).

Usage: ``.venv/bin/python scripts/family_doors.py [--jobs 2] [--verbs train,infer] [family ...]``.
About 30 s per family and verb on one core of the 2-core machine (an hour for every family).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TRAIN = '''import sys, torch, transformers
transformers.logging.set_verbosity_error()
cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg)
rows = min(model.get_input_embeddings().weight.shape[0], model.get_output_embeddings().out_features)
special = {v for k, v in cfg.to_dict().items() if k.endswith(("_token_id", "_token_index")) and isinstance(v, int)}
allowed = torch.tensor([i for i in range(min(rows, 2000)) if i not in special])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(12):
    x = allowed[torch.randint(len(allowed), (2, 12))]
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", round(float(loss), 4))
'''

INFER = '''import sys, torch, transformers
transformers.logging.set_verbosity_error()
cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
rows = model.get_input_embeddings().weight.shape[0]
special = {v for k, v in cfg.to_dict().items() if k.endswith(("_token_id", "_token_index")) and isinstance(v, int)}
allowed = torch.tensor([i for i in range(min(rows, 2000)) if i not in special])
for _ in range(10):
    x = allowed[torch.randint(len(allowed), (1, 8))]
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=3, do_sample=False)
print("done", tuple(out.shape))
'''


def one(family: str, verb: str, work: Path) -> str:
    """One family through one script: a line that starts with its verdict."""
    from lmprof.measure.model_facts.tiny import tiny_config

    folder = work / "models" / family
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(tiny_config(family).to_json_string())
    except Exception as exc:  # noqa: BLE001 - a family's own config code
        return f"NO-CONFIG {family:28s} {verb:5s} {type(exc).__name__}: {str(exc)[:120]}"
    script = work / f"user_{verb}.py"
    python = sys.executable
    lmprof = str(Path(python).parent / "lmprof")
    alone = subprocess.run([python, str(script), str(folder)], capture_output=True, text=True, timeout=900)
    runs = work / "runs" / verb / family
    flags = ["--infer"] if verb == "infer" else []
    under = subprocess.run([lmprof, "run", *flags, "--steps", "2", "--warmup", "2", "--profile-steps", "1",
                            "--no-report", "--out", str(runs), str(script), str(folder)],
                           capture_output=True, text=True, timeout=900)
    wrote = len(list(runs.glob("*/run.json"))) if runs.is_dir() else 0
    new_traceback = "Traceback" in under.stderr and "Traceback" not in alone.stderr
    same = under.returncode == alone.returncode and under.stdout == alone.stdout
    said = [line for line in under.stderr.splitlines() if line.startswith("lmprof")][-1:]
    if same and not new_traceback and (wrote or alone.returncode):
        verdict = "OK" if alone.returncode == 0 else "OK-FAILS-ALONE"
    elif under.stdout != alone.stdout and not new_traceback and wrote and under.returncode == alone.returncode and (
            subprocess.run([python, str(script), str(folder)], capture_output=True, text=True,
                           timeout=900).stdout != alone.stdout):
        verdict = "OK-NOT-REPEATABLE"  # the script alone prints something else each run (Reformer's torch.seed())
    else:
        verdict = "BROKEN"
    return (f"{verdict} {family:28s} {verb:5s} exit {alone.returncode}/{under.returncode} "
            f"stdout {'same' if under.stdout == alone.stdout else 'DIFFERS'} run.json {wrote}"
            f"{' NEW-TRACEBACK' if new_traceback else ''} | {said[0][:160] if said else ''}")


def main() -> int:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--verbs", default="train,infer")
    args = parser.parse_args()
    families = args.families or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    work = Path(tempfile.mkdtemp(prefix="lmprof-doors-"))
    (work / "user_train.py").write_text(TRAIN)
    (work / "user_infer.py").write_text(INFER)
    jobs = [(f, v) for v in args.verbs.split(",") for f in families]
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda job: one(job[0], job[1], work), jobs):
            counts[line.split()[0]] = counts.get(line.split()[0], 0) + 1
            print(line, flush=True)
    print(" ".join(f"{k} {v}" for k, v in sorted(counts.items())), f"(work folder {work})")
    return 1 if counts.get("BROKEN") else 0


if __name__ == "__main__":
    sys.exit(main())
