"""Record a fixed set of small lmprof runs, and compare two such sets field by field.

    python scripts/compare_runs.py record OUT           # every door once, fixed seeds, small counts
    python scripts/compare_runs.py compare BEFORE AFTER [--noise BEFORE2]

A refactoring of the measurement protocol must leave the run format and every figure as they were.
``record`` runs each door (``lmprof train`` / ``infer``, ``lmprof run`` of a training script and of a
generate() script, ``lmprof.profile()`` in training and inference, the Python API, the Hugging Face
Trainer and Lightning callbacks, ``lmprof run --nproc 2``) with this checkout's lmprof, and keeps each
run folder's run.json under ``OUT/<case>/``.

``compare`` walks two run.json files of the same case: the keys of every section, every metric's
unit, source and whether it has a value, the value itself of every figure that is not a timing
(FLOPs, bytes, counts, tokens), the blocks (name, phase, calls, FLOPs, bytes), the operators (name,
calls), the tables' columns, the files and the notes (with their numbers masked). Timings differ from
run to run and are compared for presence only. With ``--noise`` (a second recording of the same
code), a field that already differs between two recordings of the same code is reported as
"varies run to run" instead of as a difference. Exit status 1 when a difference remains.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
LMPROF = [sys.executable, "-m", "lmprof"]

# Units of figures that are no timing: their values must be the same before and after.
EXACT_UNITS = {"count", "tokens", "B", "FLOP", "FLOPs", "rank", "layers", "params", "bytes", "nats/token"}
# Figures counted, not timed, whatever their unit says.
EXACT_KEYS = re.compile(r"^(params|tokens_per_step|kv_cache.*|memory\..*|flops\..*|.*\.flops\..*|world_size|"
                        r"compile\.(graphs|recompiles|graph_breaks).*)$")
# Notes that say how a timing came out (which blocks the profiler's cost swamped, which ran above the
# roofline, how far the blocks' sum was from the clean step): they vary from run to run as timings do.
TIMING_NOTES = re.compile(r"the profiler's own cost exceeded|ran above the roofline|after removing the profiler's "
                          r"per-event cost|blocks add up to")
# Figures whose value is measured from the process and moves from run to run (peak RSS, the
# allocator's peak on a busy machine): compared for presence only.
MOVING_KEYS = re.compile(r"^memory\.(peak_rss|process.*)$")

MLP = """
import sys, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
class Net(nn.Module):  # a model lmprof has no formulas for: FLOPs counted, memory measured only
    def __init__(self, vocab=256, width=32):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, width), nn.Linear(width, vocab)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
    def forward(self, x):
        h = self.emb(x)
        return self.head(h + self.mlp(h))
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def batch():
    return torch.randint(0, 256, (4, 16))
"""

GPT2 = """
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.set_num_threads(1)
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64)
model = GPT2LMHeadModel(config)
"""

SCRIPTS = {
    "train_mlp.py": MLP + """
steps = int(sys.argv[1])
for i in range(steps):
    x = batch()
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
print("script done")
""",
    "train_gpt2.py": GPT2 + """
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i in range(int(sys.argv[1])):
    x = torch.randint(0, 128, (2, 32))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
""",
    "generate.py": GPT2 + """
model.eval()
ids = torch.randint(0, 128, (2, 16))
for _ in range(int(sys.argv[1])):
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                   pad_token_id=0)
""",
    "profile_train.py": MLP + """
import lmprof
with lmprof.profile(model, out=sys.argv[1], warmup=2, steps=3, profile_steps=2, report=False, verbose=False) as prof:
    for i in range(10):
        x = batch()
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        opt.zero_grad()
        prof.step()
""",
    "profile_infer.py": GPT2 + """
import lmprof
model.eval()
prompt = torch.randint(0, 128, (2, 16))
with torch.no_grad(), lmprof.profile(model, out=sys.argv[1], infer=True, warmup=1, steps=3, profile_steps=1,
                                     report=False, verbose=False) as prof:
    for _ in range(7):
        out = model(prompt, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(5):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        prof.step()
""",
    "api.py": MLP + """
import lmprof
from transformers import GPT2Config, GPT2LMHeadModel
batches = [batch() for _ in range(4)]
loss_fn = lambda m, x: nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
lmprof.profile_training(model, batches, opt, steps=3, warmup=2, profile_steps=2, loss_fn=loss_fn,
                        out_dir=sys.argv[1] + "/train")
g = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64))
lmprof.profile_inference(g, torch.randint(0, 128, (2, 16)), new_tokens=6, steps=3, warmup=1, profile_steps=1,
                         out_dir=sys.argv[1] + "/infer")
""",
    "trainer.py": GPT2 + """
import lmprof
from transformers import Trainer, TrainingArguments
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 128, (12 * 2, 32))]
cb = lmprof.integrations.TrainerCallback(out=sys.argv[1], warmup=2, steps=3, profile_steps=2, verbose=False,
                                         report=False)
args = TrainingArguments(output_dir=sys.argv[1] + "/../trainer", max_steps=12, per_device_train_batch_size=2,
                         logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                         dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
""",
    "lightning.py": """
import sys, torch
import pytorch_lightning as pl
import transformers
import lmprof
torch.set_num_threads(1)
torch.manual_seed(0)
class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32,
                                                                          vocab_size=128, n_positions=32))
    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.model(input_ids=x, labels=x).loss
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randint(0, 128, (48, 32)))
cb = lmprof.integrations.LightningCallback(out=sys.argv[1], warmup=1, steps=3, profile_steps=2, verbose=False,
                                           report=False)
trainer = pl.Trainer(max_steps=10, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1] + "/..",
                     callbacks=[cb])
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
""",
    "ddp.py": MLP + """
import torch.distributed as dist
dist.init_process_group("gloo")
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
for i in range(10):
    x = batch()
    nn.functional.cross_entropy(ddp(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
""",
}

SMALL = ["--warmup", "2", "--steps", "3", "--profile-steps", "2"]
# case -> (argv after `python`, or after `lmprof` when it starts with "lmprof"); {out} and {s} are filled in
CASES: dict[str, list[str]] = {
    "train_tiny": ["lmprof", "train", "--preset", "tiny", "--batch-size", "2", "--seq-len", "32", *SMALL,
                   "--seed", "0", "--no-report", "--out", "{out}"],
    "train_tiny_defaults": ["lmprof", "train", "--preset", "tiny", "--batch-size", "2", "--seq-len", "32",
                            "--seed", "0", "--no-report", "--out", "{out}"],
    "infer_tiny": ["lmprof", "infer", "--preset", "tiny", "--prompt-len", "16", "--new-tokens", "6", "--warmup", "1",
                   "--steps", "3", "--profile-steps", "2", "--seed", "0", "--no-report", "--out", "{out}"],
    "infer_hf": ["lmprof", "infer", "--hf-config", "tiny-llama", "--prompt-len", "16", "--new-tokens", "6",
                 "--warmup", "1", "--steps", "3", "--profile-steps", "1", "--seed", "0", "--no-report", "--out",
                 "{out}"],
    "run_train_mlp": ["lmprof", "run", "--no-report", "--out", "{out}", "{s}/train_mlp.py", "20"],
    "run_train_gpt2": ["lmprof", "run", *SMALL, "--no-report", "--out", "{out}", "{s}/train_gpt2.py", "12"],
    "run_short": ["lmprof", "run", "--no-report", "--out", "{out}", "{s}/train_mlp.py", "3"],
    "run_generate": ["lmprof", "run", "--infer", "--warmup", "1", "--steps", "3", "--profile-steps", "1",
                     "--no-report", "--out", "{out}", "{s}/generate.py", "6"],
    "run_generate_one": ["lmprof", "run", "--infer", "--no-report", "--out", "{out}", "{s}/generate.py", "1"],
    "profile_train": ["{s}/profile_train.py", "{out}"],
    "profile_infer": ["{s}/profile_infer.py", "{out}"],
    "api": ["{s}/api.py", "{out}"],
    "trainer_callback": ["{s}/trainer.py", "{out}"],
    "lightning_callback": ["{s}/lightning.py", "{out}"],
    "run_nproc2": ["lmprof", "run", "--nproc", "2", *SMALL, "--no-report", "--out", "{out}", "{s}/ddp.py"],
}


def record(out: Path, only: list[str], cache: Path | None) -> None:
    """Run every case (or those in ``only``) into ``out/<case>``: run folders, stdout and stderr.

    Each case gets its own calibration cache, a copy of ``cache`` (a folder of lmprof calibration
    files): the peak and bandwidth figures then come from the same file before and after, never from
    a quick check that one run made and the next one found (or a busy machine disturbed)."""
    scripts = out / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    for name, source in SCRIPTS.items():
        (scripts / name).write_text(textwrap.dedent(source))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for case, argv in CASES.items():
        if only and case not in only:
            continue
        folder = out / case
        shutil.rmtree(folder, ignore_errors=True)
        runs = folder / "runs"
        runs.mkdir(parents=True)
        env["LMPROF_CACHE_DIR"] = str(folder / "cache")
        if cache is not None:
            shutil.copytree(cache, folder / "cache")
        args = [a.format(out=runs, s=scripts) for a in argv]
        cmd = [*LMPROF, *args[1:]] if args[0] == "lmprof" else [sys.executable, *args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        (folder / "stdout.txt").write_text(proc.stdout)
        (folder / "stderr.txt").write_text(proc.stderr)
        found = sorted(p.relative_to(runs) for p in runs.rglob("run.json"))
        print(f"{case}: exit {proc.returncode}, {len(found)} run.json: {', '.join(map(str, found)) or '-'}")
        if proc.returncode != 0:
            print(textwrap.indent(proc.stderr[-2000:], "    "))


def run_files(case_dir: Path) -> dict[str, Path]:
    """The run.json files of one case, by a name that does not depend on the run folder's time stamp."""
    runs = case_dir / "runs"
    found: dict[str, Path] = {}
    for path in sorted(runs.rglob("run.json")):
        parts = path.relative_to(runs).parts[:-1]
        # <stamp>-<mode>-<label>... is the run folder; rank<r>, train/infer (the API) are kept
        key = "/".join("run" if re.match(r"\d{8}-\d{6}-", p) else p for p in parts) or "run"
        found[key] = path
    return found


def _mask(text: str) -> str:
    """A note or path with its numbers, paths and run-folder names masked (they move from run to run)."""
    text = re.sub(r"(?<![\w.])/[^\s,;:()'\"]+", "<path>", text)
    text = re.sub(r"\d{8}-\d{6}[-\w.]*", "<run>", text)
    return re.sub(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?", "#", text)


def flatten(run: dict[str, Any]) -> dict[str, Any]:
    """run.json as {field path: comparable value}: what must not change, and markers for what may."""
    out: dict[str, Any] = {}
    for key in ("schema", "version", "mode", "noisy"):
        if key in run:
            out[key] = run[key] if key != "version" else "<version>"
    for key, value in (run.get("config") or {}).items():
        out[f"config.{key}"] = _mask(value) if isinstance(value, str) else _masked_value(value)
    for key, value in (run.get("env") or {}).items():
        out[f"env.{key}"] = "<present>" if value is not None else None
    for key, m in (run.get("metrics") or {}).items():
        unit, value = m.get("unit"), m.get("value")
        out[f"metrics.{key}.unit"] = unit
        out[f"metrics.{key}.source"] = m.get("source")
        exact = ((unit in EXACT_UNITS or EXACT_KEYS.match(key) or m.get("source") == "estimated")
                 and not MOVING_KEYS.match(key) and "/s" not in (unit or ""))
        out[f"metrics.{key}.value"] = (value if exact else ("<value>" if value is not None else None))
        if m.get("n") is not None:
            out[f"metrics.{key}.n"] = m.get("n")
        out[f"metrics.{key}.note"] = _mask(m["note"]) if m.get("note") else None
        out[f"metrics.{key}.keys"] = sorted(m)
    for b in run.get("blocks") or []:
        where = f"blocks.{b.get('phase')}/{b.get('name')}"
        out[where] = {k: b.get(k) for k in ("calls", "flops", "bytes")}
        out[where + ".keys"] = sorted(b)
        out[where + ".stopwatch"] = "<value>" if b.get("stopwatch_ms") is not None else None
    for o in run.get("ops") or []:  # the table keeps the top operators by time: which ones varies
        out[f"ops?{o.get('name')}"] = o.get("calls")
        out["ops.keys"] = sorted(o)
    for name, rows in (run.get("tables") or {}).items():
        rows = rows if isinstance(rows, list) else [rows]
        out[f"tables.{name}.rows"] = len(rows)
        out[f"tables.{name}.columns"] = sorted({k for r in rows if isinstance(r, dict) for k in r})
    for key, value in (run.get("files") or {}).items():
        out[f"files.{key}"] = value
    # The noise verdict and the notes that judge a timing (a block's share of the profiler's cost, a
    # roofline overshoot) move with the machine's load: compared for nothing, as timings are.
    kept = [_mask(n) for n in run.get("notes") or [] if not TIMING_NOTES.search(n)]
    for note in sorted(set(kept)):
        out[f"notes[{note[:100]}]"] = kept.count(note)
    out["keys"] = sorted(run)
    return out


def _masked_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_mask(v) if isinstance(v, str) else v for v in value]
    return value


def diff(a: dict[str, Any], b: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    for key in sorted(set(a) | set(b)):
        if key.startswith("ops?") and (key not in a or key not in b):
            continue  # an operator in one top list only: a timing, not a difference
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            yield key, a.get(key, "<absent>"), b.get(key, "<absent>")


def compare(before: Path, after: Path, noise: Path | None) -> int:
    """Print every difference between two recordings, case by case; the number of differences."""
    total = 0
    for case in sorted(CASES):
        if not (before / case).is_dir() or not (after / case).is_dir():
            print(f"{case}: not recorded on both sides")
            total += 1
            continue
        ra, rb = run_files(before / case), run_files(after / case)
        rn = run_files(noise / case) if noise is not None and (noise / case).is_dir() else {}
        if sorted(ra) != sorted(rb):
            print(f"{case}: run folders differ: {sorted(ra)} vs {sorted(rb)}")
            total += 1
        for name in sorted(set(ra) & set(rb)):
            fa = flatten(json.loads(ra[name].read_text()))
            fb = flatten(json.loads(rb[name].read_text()))
            fn = flatten(json.loads(rn[name].read_text())) if name in rn else None
            moving = {k for k, _, _ in diff(fa, fn)} if fn is not None else set()
            found = [(k, x, y) for k, x, y in diff(fa, fb) if k not in moving]
            varies = [k for k, _, _ in diff(fa, fb) if k in moving]
            label = f"{case} [{name}]"
            print(f"{label}: {len(fa)} fields, {'same' if not found else f'{len(found)} differ'}"
                  + (f" ({len(varies)} vary run to run: {', '.join(varies[:6])}{' ...' if len(varies) > 6 else ''})"
                     if varies else ""))
            for key, x, y in found:
                print(f"    {key}:\n      before: {_short(x)}\n      after:  {_short(y)}")
            total += len(found)
    print(f"differences: {total}")
    return total


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) < 400 else text[:400] + " ..."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the fixed set of small runs into OUT")
    rec.add_argument("out", type=Path)
    rec.add_argument("--only", nargs="*", default=[], help="only these cases")
    rec.add_argument("--cache", type=Path, help="a folder of calibration files every case starts from")
    cmp = sub.add_parser("compare", help="compare two recordings field by field")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--noise", type=Path, help="a second recording of BEFORE's code: what varies run to run")
    args = parser.parse_args()
    if args.cmd == "record":
        record(args.out, args.only, args.cache)
        return 0
    return 1 if compare(args.before, args.after, args.noise) else 0


if __name__ == "__main__":
    sys.exit(main())
