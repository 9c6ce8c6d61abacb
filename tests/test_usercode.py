"""Profiling the user's own code, unchanged: ``lmprof run``, ``lmprof.profile``, the Trainer callback.

Every script here is written into tmp_path and times its own steps with its own stopwatch
(perf_counter after each optimizer step, or around each generate call) into a JSON file. The
independent truths are that stopwatch, run with lmprof and without it in the same test, and the
script's exit code and stdout.

Timing comparisons (lmprof's clean step vs the script's own un-profiled step, within 10%) are the
issue's explicit requirement. They use medians over >= 10 steps of a model big enough that a step
is tens of milliseconds, with one torch thread; the reference is the median of two plain runs, one
before and one after the profiled run, so machine-load drift hits both sides, and a round is
retried (up to 5) when a shared machine's noise alone breaks the bound (see matches_unprofiled).
Separately, lmprof's clean figure must match the script's own stopwatch over the very same steps.
"""
from __future__ import annotations

import json
import os
import runpy
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from lmprof.cli.main import main
from lmprof.record.run import Run
from record_checks import assert_tables_documented, assert_valid

TOL = 0.10  # the bound

PLAIN = """
import json, sys, time
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
steps, out = int(sys.argv[1]), sys.argv[2]
accum = int(sys.argv[3]) if len(sys.argv) > 3 else 1
raise_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)) for _ in range(2))
        self.head = nn.Linear(128, 1000)
    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)

model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ends = []
for i in range(steps):
    if raise_at and i == raise_at:
        raise ValueError("boom at step %d" % i)
    for _ in range(accum):
        x = torch.randint(0, 1000, (8, 64))
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()) / accum
        loss.backward()
    opt.step()
    opt.zero_grad()
    ends.append(time.perf_counter())
json.dump([b - a for a, b in zip(ends, ends[1:])], open(out, "w"))
print("script done")
"""



def gpt2_script(count: str, mode: str, n_layer: int, n_embd: int, vocab_size: int) -> str:
    """The head of a script on a random-weight GPT-2: ``<count>, out = argv[1:3]``, then ``config`` and
    ``model`` (in ``mode``: train or eval) are defined; one torch thread, seeded."""
    return f"""
import json, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.set_num_threads(1)
torch.manual_seed(0)
{count}, out = int(sys.argv[1]), sys.argv[2]
config = GPT2Config(n_layer={n_layer}, n_head=4, n_embd={n_embd}, vocab_size={vocab_size}, n_positions=128)
model = GPT2LMHeadModel(config).{mode}()
"""


GPT2_LESSON = gpt2_script("steps", "train", 2, 128, 1024) + """optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
B, T = 4, 64
position_ids = torch.arange(T).unsqueeze(0).expand(B, T)

def step():
    input_ids = torch.randint(0, config.vocab_size, (B, T))
    labels = torch.randint(0, config.vocab_size, (B, T))
    loss = model(input_ids=input_ids, labels=labels, position_ids=position_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

ends = []
for _ in range(steps):
    step()
    ends.append(time.perf_counter())
json.dump([b - a for a, b in zip(ends, ends[1:])], open(out, "w"))
"""

GENERATE = gpt2_script("calls", "eval", 4, 256, 4096) + """ids = torch.randint(0, config.vocab_size, (4, 32))
times = []
for _ in range(calls):
    t = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                   do_sample=False, pad_token_id=0)
    times.append(time.perf_counter() - t)
json.dump(times, open(out, "w"))
"""

TRAINER = """
import json, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, TrainerCallback
torch.set_num_threads(1)
torch.manual_seed(0)
steps, out, tmp, use_lmprof = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
config = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1024, n_positions=128)
model = GPT2LMHeadModel(config)
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 1024, (steps * 4, 64))]

class Stopwatch(TrainerCallback):
    ends = []
    def on_step_end(self, args, state, control, **kw):
        self.ends.append(time.perf_counter())

callbacks = [Stopwatch()]
if use_lmprof:
    import lmprof
    callbacks.append(lmprof.integrations.TrainerCallback(out=tmp + "/runs", verbose=False))
args = TrainingArguments(output_dir=tmp + "/trainer", max_steps=steps, per_device_train_batch_size=4,
                         logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0, seed=0)
Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
e = Stopwatch.ends
json.dump([b - a for a, b in zip(e, e[1:])], open(out, "w"))
"""


def _env() -> dict[str, str]:
    import lmprof

    src = str(Path(lmprof.__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def plain(script: Path, *args: object) -> int:
    """Run the script un-profiled, in this process, as python would."""
    old = sys.argv[:]
    sys.argv = [str(script), *map(str, args)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = old
    return 0


def lmprof_run(tmp_path: Path, *argv: object) -> tuple[int, Path | None]:
    out = tmp_path / "runs"
    code = main(["run", "--out", str(out), "--no-report", *map(str, argv)])
    folders = sorted(p for p in out.iterdir() if (p / "run.json").is_file()) if out.is_dir() else []
    return code, (folders[-1] if folders else None)


def own_steps(path: Path) -> list[float]:
    return [s * 1e3 for s in json.loads(path.read_text())]


def reference(script: Path, tmp_path: Path, n: int, *extra: object, skip: int = 3,
              count: int | None = None) -> list[float]:
    """The script's own step times (ms) from one un-profiled run, warm-up dropped: ``count`` steps
    after the first ``skip`` (all of them by default)."""
    out = tmp_path / f"plain-{len(list(tmp_path.glob('plain-*')))}.json"
    assert plain(script, n, out, *extra) == 0
    return own_steps(out)[skip:None if count is None else skip + count]


def check_blocks(run: Run, phases: tuple[str, str], clean_key: str) -> None:
    """Blocks cover both phases and add up to the clean step."""
    seen = {b.phase for b in run.blocks}
    assert set(phases) <= seen, seen
    for ph in phases:
        assert sum(b.time_ms for b in run.blocks if b.phase == ph) > 0
    clean = run.metrics[clean_key].value
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(clean, rel=1e-6)
    assert (run.folder / "trace.json.gz").is_file() and (run.folder / "blocks.csv").is_file()


def matches_unprofiled(profiled: Callable[[], tuple[Run, float]], unprofiled: Callable[[], list[float]],
                       attempts: int = 5) -> Run:
    """Run the script un-profiled, under lmprof, un-profiled again; lmprof's clean figure must be
    within TOL of the median of the script's own un-profiled steps.

    On a machine shared with other jobs a run's median can move by more than 10% from one run to
    the next; a bias of lmprof's would move every attempt, noise does not, so up to ``attempts``
    rounds are taken and one within bounds passes. Returns the last profiled run.
    """
    seen = []
    for _ in range(attempts):
        before = unprofiled()
        try:
            run, clean = profiled()
        except AssertionError as exc:  # profiled()'s own same-steps check: also noise-prone, also retaken
            seen.append(" ".join(str(exc).split())[:120])
            continue
        plain_steps = before + unprofiled()
        ref = statistics.median(plain_steps)
        # the un-profiled steps too: whether a failure is a bias of lmprof's or a machine's spread
        seen.append(f"{clean:.2f} vs {ref:.2f} ms (un-profiled {min(plain_steps):.1f}-{max(plain_steps):.1f})")
        if abs(clean - ref) / ref < TOL:
            return run
    raise AssertionError(f"lmprof's clean figure vs the script's own un-profiled one, each attempt: {seen}")


@pytest.mark.stopwatch
def test_plain_script_own_loop_and_model(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", PLAIN)

    def profiled() -> tuple[Run, float]:
        code, folder = lmprof_run(tmp_path, script, 20, tmp_path / "own.json")
        assert code == 0 and folder is not None
        run = Run.load(folder)
        # The same steps, timed by the script itself while lmprof watched: steps 4..12 (its step 13
        # also holds the profiler's start, which lmprof's clock leaves out of the clean step).
        same = own_steps(tmp_path / "own.json")[2:11]
        assert run.metrics["step_time"].value == pytest.approx(statistics.median(same), rel=TOL)
        return run, run.metrics["step_time"].value

    run = matches_unprofiled(profiled, lambda: reference(script, tmp_path, 20))
    assert run.mode == "train" and run.config["model_name"] == "Net"
    check_blocks(run, ("forward", "backward"), "step_time")
    names = {b.name for b in run.blocks if b.phase == "forward"}
    # Module paths; each layer its own row in the record, folded into one in the table.
    assert {"layers.*.0[0]", "layers.*.0[1]", "layers.*.2[1]", "head", "emb", "loss"} <= names
    from lmprof.show.summary import render_text

    section = render_text(run).split("Where the step goes")[1].split("Top operators")[0]
    rows = [line for line in section.splitlines() if "│" in line]
    assert any(r.split("│")[0].strip() == "layers.*.0" for r in rows) and not any("layers.*.0[" in r for r in rows)
    assert run.metrics["tokens_per_step"].value == 8 * 64


@pytest.mark.stopwatch
def test_gpt2_lesson_loop(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = write(tmp_path, "lesson.py", GPT2_LESSON)

    def profiled() -> tuple[Run, float]:
        code, folder = lmprof_run(tmp_path, script, 20, tmp_path / "own.json")
        assert code == 0 and folder is not None
        run = Run.load(folder)
        return run, run.metrics["step_time"].value

    run = matches_unprofiled(profiled, lambda: reference(script, tmp_path, 20))
    check_blocks(run, ("forward", "backward"), "step_time")
    fwd = {b.name for b in run.blocks if b.phase == "forward"}
    bwd = {b.name for b in run.blocks if b.phase == "backward"}
    assert {"embedding", "attn.qkv", "mlp.fc", "lm_head"} <= fwd and {"attn.qkv", "mlp.fc"} <= bwd
    assert run.config["model_type"] == "gpt2" and run.config["batch_size"] == 4 and run.config["seq_len"] == 64


@pytest.mark.stopwatch
def test_trainer_callback(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = write(tmp_path, "hf_trainer.py", TRAINER)

    def profiled() -> tuple[Run, float]:
        done = set((tmp_path / "runs").iterdir()) if (tmp_path / "runs").is_dir() else set()
        assert plain(script, 20, tmp_path / "own.json", tmp_path, 1) == 0
        new = set((tmp_path / "runs").iterdir()) - done
        assert len(new) == 1
        run = Run.load(new.pop())
        same = own_steps(tmp_path / "own.json")[2:12]  # the Trainer's steps 4..13, by the script's stopwatch
        assert run.metrics["step_time"].value == pytest.approx(statistics.median(same), rel=TOL)
        return run, run.metrics["step_time"].value

    run = matches_unprofiled(profiled, lambda: reference(script, tmp_path, 20, tmp_path, 0))
    assert run.config["source"] == "TrainerCallback"
    check_blocks(run, ("forward", "backward"), "step_time")
    assert {"attn.qkv", "mlp.fc"} <= {b.name for b in run.blocks if b.phase == "backward"}
    # the Trainer clips gradients by default (max_grad_norm 1.0, through accelerate): its own row
    assert {"optimizer", "zero_grad", "grad_clip"} <= {b.name for b in run.blocks if b.phase == "step"}


@pytest.mark.stopwatch
def test_generate_script_with_infer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = write(tmp_path, "gen.py", GENERATE)

    def profiled() -> tuple[Run, float]:
        # one profiled generation (the default is 3, lmprof/counts.py): its timing, not the window, is tested
        code, folder = lmprof_run(tmp_path, "--infer", "--profile-steps", 1, script, 10, tmp_path / "own.json")
        assert code == 0 and folder is not None
        run = Run.load(folder)
        same = own_steps(tmp_path / "own.json")[1:6]  # generations 2..6: lmprof's clean ones
        assert run.metrics["e2e_latency"].value == pytest.approx(statistics.median(same), rel=TOL)
        return run, run.metrics["e2e_latency"].value

    # Against the same generations un-profiled (2..6). A script's later generations run faster than its
    # first few (here: generations 2..6 took 1-10% longer than 11..20 in plain runs, 4.5% on average),
    # and against generations 2..10 CI once measured lmprof's clean figure 11-15% high on all five attempts.
    run = matches_unprofiled(profiled, lambda: reference(script, tmp_path, 10, skip=1, count=5))
    assert run.mode == "infer"
    check_blocks(run, ("prefill", "decode"), "e2e_latency")
    assert {"attn.qkv", "mlp.fc", "lm_head"} <= {b.name for b in run.blocks if b.phase == "decode"}
    assert run.config["new_tokens"] == 12 and run.config["batch_size"] == 4 and run.config["seq_len"] == 32
    # TTFT + decode steps make up the generation (only the tail after the last forward is outside).
    ttft, tpot, e2e = (run.metrics[k].value for k in ("ttft", "tpot", "e2e_latency"))
    assert ttft < e2e and ttft + 11 * tpot == pytest.approx(e2e, rel=0.35)


def test_gradient_accumulation(tmp_path: Path) -> None:
    script = write(tmp_path, "accum.py", PLAIN)
    code, folder = lmprof_run(tmp_path, "--steps", 5, "--warmup", 1, "--profile-steps", 2, script, 12,
                              tmp_path / "own.json", 3)
    assert code == 0 and folder is not None
    run = Run.load(folder)
    check_blocks(run, ("forward", "backward"), "step_time")
    assert any("gradient accumulation: 3 batches per optimizer step" in n for n in run.notes)
    assert run.metrics["tokens_per_step"].value == 3 * 8 * 64
    # Each optimizer step holds three forward+backward: the model's blocks run three times per step.
    assert next(b for b in run.blocks if b.name == "head" and b.phase == "forward").calls == 3


def test_script_that_raises_mid_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path, "crash.py", PLAIN)
    # Steps: 1 warm-up, 5 clean, 1 profiler warm-up, then 3 profiled: raising before step 10 leaves
    # two profiled steps complete and the third cut short (left out).
    code, folder = lmprof_run(tmp_path, "--steps", 5, "--warmup", 1, "--profile-steps", 3, script, 40,
                              tmp_path / "own.json", 1, 9)
    err = capsys.readouterr().err
    assert code == 1 and "ValueError: boom at step 9" in err
    assert "lmprof: the script raised ValueError after 9 step(s), with all 5 clean steps timed and 2 of 3 profiled" in err
    run = Run.load(folder)
    assert run.metrics["step_time"].n == 5
    assert run.tables["attribution"][0]["profiled_steps"] == 2
    check_blocks(run, ("forward", "backward"), "step_time")


def test_early_exit_keeps_exit_code_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path, "bye.py", """
        import sys, torch
        m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
        sys.exit(3)
    """)
    code, folder = lmprof_run(tmp_path, script)
    err = capsys.readouterr().err
    # Step 1 only marks a start, step 2 is the figures step: a first-call run, marked as such.
    assert code == 3 and folder is not None
    assert ("lmprof: the script exited (code 3) after 2 step(s), during warm-up (3): wrote what was measured "
            "(rough first-call timings: see the note)") in err
    assert Run.load(folder).metrics["step_time"].note.startswith("first call")


def test_script_without_optimizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path, "noopt.py", "print('hello')\n")
    code, folder = lmprof_run(tmp_path, script)
    captured = capsys.readouterr()
    assert code == 0 and folder is None and captured.out == "hello\n"
    assert "without stepping a torch.optim optimizer lmprof could see: nothing measured" in captured.err


def test_module_mode_and_stop_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "train.py", """
        import sys, torch
        m = torch.nn.Linear(32, 32); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        assert sys.argv[1:] == ["--steps", "1000"], sys.argv
        for _ in range(int(sys.argv[2])):
            m(torch.randn(8, 32)).sum().backward(); opt.step(); opt.zero_grad()
        print("finished all steps")
    """)
    monkeypatch.chdir(tmp_path)
    code, folder = lmprof_run(tmp_path, "--stop-after", "--steps", 3, "--warmup", 1, "--profile-steps", 1,
                              "-m", "mypkg.train", "--steps", 1000)
    captured = capsys.readouterr()
    assert code == 0 and folder is not None
    assert "finished all steps" not in captured.out
    assert "--stop-after: stopped the script" in captured.err
    assert Run.load(folder).config["script"] == "-m mypkg.train"


def test_profile_context_manager(tmp_path: Path) -> None:
    import torch

    import lmprof

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with lmprof.profile(model, out=tmp_path, warmup=1, steps=4, profile_steps=2, report=False, verbose=False) as prof:
        for _ in range(12):
            model(torch.randn(16, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.message is None and prof.folder is not None
    run = Run.load(prof.folder)
    assert run.config["source"] == "lmprof.profile" and run.metrics["step_time"].n == 4
    check_blocks(run, ("forward", "backward"), "step_time")
    assert {"optimizer", "zero_grad"} <= {b.name for b in run.blocks}
    # Nothing of lmprof is left behind: the optimizer and the model are as before.
    assert "zero_grad" not in vars(opt) and not model._forward_hooks and not model._forward_pre_hooks


@pytest.mark.slow
def test_cli_leaves_stdout_to_the_script(tmp_path: Path) -> None:
    script = write(tmp_path, "t.py", """
        import sys, torch
        m = torch.nn.Linear(16, 16); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(12):
            m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
        print("out:", sys.argv[1:])
        sys.exit(5)
    """)
    proc = subprocess.run([sys.executable, "-m", "lmprof", "run", "--steps", "3", "--warmup", "1", "--profile-steps", "1",
                           "--no-plots", "--out", str(tmp_path / "runs"), str(script), "--lr", "3e-4"],
                          capture_output=True, text=True, timeout=240, env=_env())
    assert proc.returncode == 5
    assert proc.stdout == "out: ['--lr', '3e-4']\n"
    assert "lmprof train — Linear" in proc.stderr and "report:" in proc.stderr


# Once skipped: under load a rank could hang at exit, gdb showing ~ProcessGroupGloo joining gloo's worker
# threads with the GIL held while a worker, freeing a finished all-reduce, waited for the GIL to drop the
# Python state captured with the work (at::ThreadLocalState; in torch 2.13 every backward() puts a
# Python object there, and lmprof's FlopCounterMode is another). A rank of `lmprof run` now ends without
# Python's finalization once its run is written (distributed.end_rank_process), so gloo's threads are
# never joined; this test checks the launch and, through the exit code and the script's output, that
# the ranks end as the script would. With --watch (one torchrun test for both, they are slow): rank 1's
# loader sleeps SLEEP before each forward, and the parent's watch names rank 1 a straggler by its input
# wait, the loader's time within 10% (tests/test_watch_wired.py has the rest of the watch).
@pytest.mark.slow
def test_nproc_launches_torchrun_one_folder_per_rank(tmp_path: Path) -> None:
    SLEEP = 0.004
    script = write(tmp_path, "ddp.py", f"""
        import atexit, json, sys, time, torch, torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        took = []
        for _ in range(int(sys.argv[1])):
            t0 = time.perf_counter()
            if dist.get_rank() == 1:
                time.sleep({SLEEP})  # rank 1's data loader is slow
            x = torch.randn(32, 64)
            took.append(time.perf_counter() - t0)  # the loader's time by the script's own clock
            model(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        if dist.get_rank() == 1:
            json.dump(took, open(sys.argv[2], "w"))
        print("rank", dist.get_rank(), "done")
        atexit.register(print, "atexit ran")  # a rank ends as the script would: its atexit handlers run
        dist.destroy_process_group()
    """)
    proc = subprocess.run([sys.executable, "-m", "lmprof", "run", "--nproc", "2", "--no-report", "--steps", "3",
                           "--warmup", "2", "--profile-steps", "1", "--watch", "--watch-max-captures", "0",
                           "--out", str(tmp_path / "runs"), str(script), "40", str(tmp_path / "took.json")],
                          capture_output=True, text=True, timeout=280, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("done") == 2  # both ranks' own output, untouched (lines may interleave)
    assert proc.stdout.count("atexit ran") == 2
    (folder,) = (tmp_path / "runs").iterdir()
    run = Run.load(folder)
    assert run.value("world_size") == 2 and [r["rank"] for r in run.tables["ranks"]] == [0, 1]
    assert (folder / "rank1" / "trace.json.gz").is_file()
    # --no-report reaches the ranks: no PNG drawn there either (--warmup 2: a figures step, so memory
    # was recorded and memory.png could have been)
    assert Run.load(folder / "rank0").value("memory.peak") and not list(folder.glob("**/*.png"))
    assert any(b.name == "allreduce" for b in Run.load(folder / "rank0").blocks)
    check_blocks(Run.load(folder / "rank1"), ("forward", "backward"), "step_time")
    w = run.watch  # the parent's own section: rank 0's series, the ranks compared
    assert w is not None and w.series[0].startswith("rank0/watch/")
    (st,) = [a for a in w.alerts if a.kind == "straggler"]
    assert st.evidence["rank"].value == 1 and "input wait" in st.message
    # the loader's sleep, as the script's own clock timed it (a loaded machine oversleeps), within 10%
    took = statistics.median(json.loads((tmp_path / "took.json").read_text()))
    assert took == pytest.approx(SLEEP, rel=0.5)
    assert st.evidence["figure"].value == pytest.approx(took * 1e3, rel=0.10)
    assert any(a.message.startswith("rank 1: ") and a.kind == "input_bound" for a in w.alerts)
    for record in (folder / "run.json", folder / "rank0" / "run.json", folder / "rank1" / "run.json"):
        assert_valid(record)  # the merged parent and each rank's, as published (docs/run.schema.json)
        assert_tables_documented(record)


@pytest.mark.parametrize("variant", ["compile", "gradscaler"])
def test_compiled_model_and_gradscaler(tmp_path: Path, variant: str) -> None:
    script = write(tmp_path, "v.py", f"""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        variant = {variant!r}
        fwd = torch.compile(model, backend="eager") if variant == "compile" else model
        scaler = torch.amp.GradScaler("cpu") if variant == "gradscaler" else None
        for _ in range(12):
            loss = fwd(torch.randn(32, 64)).pow(2).mean()
            if scaler:
                scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
            else:
                loss.backward(); opt.step()
            opt.zero_grad()
    """)
    code, folder = lmprof_run(tmp_path, "--steps", 3, "--warmup", 1, "--profile-steps", 2, script)
    assert code == 0 and folder is not None
    run = Run.load(folder)
    assert run.metrics["step_time"].n == 3
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.value("step_time"), rel=1e-6)
    assert any(b.phase == "backward" for b in run.blocks)
    if variant == "compile":
        assert any(n.startswith("torch.compile: the model is compiled") for n in run.notes)
        assert run.config["compile"] is True
    else:
        assert {"0", "2"} <= {b.name for b in run.blocks if b.phase == "forward"}


def test_profile_inference_loop_and_short_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lmprof.profile(infer=True) over a hand-written decoding loop; then a loop too short for the
    window: the clean figures it has are written and one line says what happened."""
    import torch

    import lmprof

    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 50)).eval()
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, warmup=1, steps=3, profile_steps=1,
                                         report=False, verbose=False) as prof:
        for _ in range(6):
            ids = torch.zeros(2, 4, dtype=torch.long)
            for _ in range(5):  # prefill, then 4 decode steps
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
            prof.step()
    run = Run.load(prof.folder)
    assert run.mode == "infer" and run.metrics["e2e_latency"].n == 3 and run.metrics["tpot"].n == 3 * 4
    check_blocks(run, ("prefill", "decode"), "e2e_latency")
    with lmprof.profile(model, out=tmp_path / "short", warmup=1, steps=10, report=False) as prof:
        for _ in range(4):
            model(torch.zeros(2, 4, dtype=torch.long)).sum().backward()
            prof.step()
    err = capsys.readouterr().err
    assert "lmprof: the with-block ended after 4 step(s), with 3 of 10 clean steps timed and none profiled" in err
    short = Run.load(prof.folder)
    assert short.metrics["step_time"].n == 3 and not short.metrics["step_time"].note.startswith("first call")
    # No profiled step completed: blocks, operators and the trace come from the figures step, and say so.
    assert short.blocks and short.ops and "trace" in short.files
    assert any("the operators and blocks come from the figures step" in n for n in short.notes)
