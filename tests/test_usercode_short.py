"""Short and hand-written inference loops: what lmprof says when it cannot time them."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("call", ["model(ids)", "model.forward(ids)"])
def test_manual_decode_loop_is_measured_whether_it_calls_the_model_or_its_forward(tmp_path: Path, call: str) -> None:
    """The slide's loop calls ``model.forward(ids)``, which runs no hook of the model (issue 49 item 8):
    its submodules' hooks still mark each forward, so both loops give the same counts. Truth: the loop
    itself (5 generations of 3 forwards on a 4-token prompt, batch 1)."""
    import torch

    import lmprof

    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).eval()
    forward = eval(f"lambda model, ids: {call}")  # noqa: S307 - the two spellings of one call, written above
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, warmup=1, steps=2, profile_steps=1,
                                         report=False, verbose=False) as prof:
        for _ in range(5):
            ids = torch.zeros(1, 4, dtype=torch.long)
            for _ in range(3):
                ids = torch.cat([ids, forward(model, ids)[:, -1:].argmax(-1)], dim=1)
            prof.step()
    run = prof.run
    assert run is not None, prof.message
    assert run.metrics["ttft"].n == 2 and run.metrics["tpot"].n == 2 * 2 and run.metrics["e2e_latency"].basis == "clean"
    assert (run.config["batch_size"], run.config["seq_len"]) == (1, 4) and run.config["new_tokens"] == 3
    assert {"prefill", "decode"} <= {b.phase for b in run.blocks}


# -- the lessons' short scripts, unchanged under lmprof run at the default settings ------------------
import subprocess  # noqa: E402
import sys  # noqa: E402

from types import SimpleNamespace  # noqa: E402

from lmprof.counts import DEFAULT_COUNTS  # noqa: E402
from lmprof.record.run import Run  # noqa: E402
from tests.test_usercode import _env, write  # noqa: E402

ONE_GENERATE = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
model = GPT2LMHeadModel(cfg).eval()
ids = torch.randint(0, 100, (1, 6))
out = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
print("tokens", out.shape[1])
"""

THREE_STEPS = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", step)
"""


@pytest.fixture
def run_cli(cli):
    """``lmprof run --no-report`` of a lesson script, through the CLI's own code in this process (a fresh
    process costs 3-4 s of imports each; what needs one, signals, forks, fd-level output, native log
    lines, is tested in test_usercode_ending, test_native_logs and test_usercode)."""

    def run(tmp_path: Path, body: str, *flags: str) -> SimpleNamespace:
        script = write(tmp_path, "lesson.py", body)
        code, out, err = cli("run", "--no-report", "--out", str(tmp_path / "runs"), *flags, str(script))
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def _the_run(tmp_path: Path) -> Run:
    folders = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
    assert len(folders) == 1, folders
    return Run.load(folders[0])


def _first_call_note(run: Run) -> str:
    notes = [n for n in run.notes if n.startswith("first call: includes warm-up costs")]
    assert len(notes) == 1, run.notes
    return notes[0]


def test_one_generate_gives_operators_blocks_ttft_tpot(tmp_path: Path, run_cli) -> None:
    pytest.importorskip("transformers")
    proc = run_cli(tmp_path, ONE_GENERATE, "--infer")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "tokens 18"  # the script's own output, unchanged
    assert "nothing measured" not in proc.stderr
    run = _the_run(tmp_path)
    ops = {o.name: o for o in run.ops}
    # Truth by hand: GPT-2's Conv1D is one addmm per projection (c_attn, c_proj, c_fc, mlp c_proj):
    # 4 per layer x 2 layers x 12 forwards; the lm_head (no bias) is an mm (or linear) per forward.
    assert ops["aten::addmm"].calls == 4 * 2 * 12, ops["aten::addmm"]
    assert "aten::mm" in ops or "aten::linear" in ops
    names = {b.name for b in run.blocks}
    assert any(n.startswith("attn") for n in names) and "lm_head" in names, names
    assert {b.phase for b in run.blocks} >= {"prefill", "decode"}
    assert run.value("ttft") and run.value("ttft") > 0
    assert run.metrics["tpot"].n == 11  # 12 new tokens: a prefill and 11 decode forwards, one sample each
    assert run.metrics["ttft"].note and run.metrics["ttft"].note.startswith("first call")
    note = _first_call_note(run)
    w, s, p = DEFAULT_COUNTS["infer"]  # the defaults' one table: 1 + 5 + 1 + 3 generations
    assert f"at least {w + s + 1 + p} generations" in note and f"--warmup {w} --steps {s} --profile-steps {p}" in note
    assert run.value("memory.peak") and run.value("kv_cache")  # the figures step's memory and cache
    assert run.metrics["profiler_overhead"].value is None


def test_three_training_steps_give_blocks_operators_and_memory(tmp_path: Path, run_cli) -> None:
    proc = run_cli(tmp_path, THREE_STEPS, "--plots")  # the PNGs without the report: asked for
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done 2"
    assert "nothing measured" not in proc.stderr
    run = _the_run(tmp_path)
    names = {b.name for b in run.blocks}
    assert {"forward", "backward", "optimizer"} <= {b.phase for b in run.blocks} | names, names
    ops = {o.name: o for o in run.ops}
    assert ops["aten::addmm"].calls == 2  # two Linear layers, one recorded step
    # Step 1 only marks a start, step 2 is the figures step (memory), step 3 counts FLOPs: step 2's time.
    assert run.metrics["step_time"].n == 1
    assert "at least 17 steps" in _first_call_note(run)
    assert run.value("memory.peak")
    # The profile is the figures step's, without FlopCounterMode in it (its Python cost per operator
    # made small operators look several times their size); the FLOPs were counted on step 3.
    profile_note = next(n for n in run.notes if "the operators and blocks come from the figures step" in n)
    assert "warm-up step 2, recorded with memory events)" in profile_note and "FlopCounterMode" not in profile_note
    assert any("FlopCounterMode on warm-up step 3" in n for n in run.notes)
    assert run.value("flops.model_per_step") == _counted(THREE_STEPS)
    folder = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert run.files.get("memory_timeline") == "memory.png" and (folder / "memory.png").stat().st_size > 5000


def _counted(script: str) -> int:
    """torch's FlopCounterMode on one training step of the script's model (its own seed, its own shapes)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    assert "torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)" in script
    with FlopCounterMode(display=False) as fc:
        model(torch.randn(8, 16)).pow(2).mean().backward()
    return int(fc.get_total_flops())


def test_two_training_steps_keep_memory_and_say_why_no_flops(tmp_path: Path, run_cli) -> None:
    proc = run_cli(tmp_path, THREE_STEPS.replace("range(3)", "range(2)"))
    assert proc.returncode == 0, proc.stderr
    run = _the_run(tmp_path)
    assert run.value("memory.peak") and run.ops  # the figures step (step 2) completed
    assert run.value("flops.model_per_step") is None
    no_count = [n for n in run.notes if n.startswith("no FLOP count")]
    assert len(no_count) == 1 and "taken on warm-up step 3" in no_count[0] and "ended before that step did" in no_count[0]


def test_six_steps_get_clean_times_and_blocks_from_the_figures_step(tmp_path: Path, run_cli) -> None:
    proc = run_cli(tmp_path, THREE_STEPS.replace("range(3)", "range(6)"))
    assert proc.returncode == 0, proc.stderr
    run = _the_run(tmp_path)
    assert run.metrics["step_time"].n == 3  # steps 4-6 of the clean window, which did not complete
    assert not any(n.startswith("first call") for n in run.notes)
    assert any("the operators and blocks come from the figures step" in n for n in run.notes)
    assert run.blocks and run.ops
    # --no-report and no --plots: no PNG drawn (matplotlib costs most of a second a run)
    folder = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert "memory_timeline" not in run.files and not list(folder.glob("*.png"))


@pytest.mark.parametrize("warmup", ["0", "2"])
def test_steps_0_is_accepted(tmp_path: Path, warmup: str, run_cli) -> None:
    proc = run_cli(tmp_path, THREE_STEPS.replace("range(3)", "range(6)"), "--steps", "0", "--warmup", warmup,
                    "--profile-steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "nothing measured" not in proc.stderr
    run = _the_run(tmp_path)
    assert run.blocks and run.ops and run.value("step_time")
    assert run.metrics["step_time"].n == 2  # the two profiled steps
    assert "under lmprof's profiler" in _first_call_note(run) and "--steps 1" in _first_call_note(run)


def test_steps_0_accepted_by_profile(tmp_path: Path) -> None:
    import torch

    import lmprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with lmprof.profile(model, out=tmp_path, warmup=0, steps=0, profile_steps=1, report=False, verbose=False) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.run is not None and prof.run.blocks and prof.run.value("step_time")


def test_negative_steps_refused(tmp_path: Path, run_cli) -> None:
    proc = run_cli(tmp_path, THREE_STEPS, "--steps", "-1")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == ["lmprof: error: --steps must be at least 0, got -1"]


@pytest.mark.parametrize("flags", [["--steps", "-1"], ["--warmup", "-2"], ["--log-to", "nope"], ["--nproc", "0"],
                                   ["--nproc", "-1"], []])
def test_refusals_are_said_before_torch_is_imported(tmp_path: Path, flags: list[str]) -> None:
    """A bad count, an unknown tracker or a missing script: one line, exit 2, in a fraction of a second,
    since nothing of torch is imported to say it (it was 2.4 s)."""
    script = str(tmp_path / ("missing.py" if not flags else "lesson.py"))
    if flags:
        write(tmp_path, "lesson.py", THREE_STEPS)
    code = ("import sys\nfrom lmprof.cli.main import main\n"
            f"rc = main(['run', *{flags!r}, {script!r}])\n"
            "print(rc, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("lmprof: error:"), proc.stderr
