"""Issue 49, round 4: what the session counts and times in users' loops, against independent truths.

* A step the user's own torch.profiler ran in is never timed (item 1). Truth: a fake clock whose
  readings are written here, with the user's profiler "on" for the steps the test says (its flag is
  replaced), so a figure taken under it would be the 10 s those steps took.
* Any counts measure what the plan says (item 9). Truth: the plan written out by hand.
"""
from __future__ import annotations

import shutil

from pathlib import Path
from typing import Any

import pytest
import torch

from lmprof.pipeline.protocol import giveway
from lmprof.pipeline.protocol.driver import Driver
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec


class Loop(Driver):
    """A loop that reports its own forwards and needs no figures step (no recording runs)."""

    hooks_forwards = False
    raises = True

    def figures_at(self, warmup: int, compiled: bool) -> int:
        return 0


def _session(tmp_path: Path, mode: str, ticks: list[float], warmup: int) -> Session:
    clock = iter(ticks)
    session = Session(Spec(mode=mode, warmup=warmup, steps=5, profile_steps=1, run_dir=tmp_path / "r", energy="off",
                           report=False, verbose=False), Loop(), clock=lambda: next(clock))
    session.attach(torch.nn.Linear(2, 2))
    return session


def _generations(session: Session, under: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """One generation (start, one forward, end) per entry, the user's profiler on where it says True."""
    on = [False]
    monkeypatch.setattr(giveway, "user_profiler_active", lambda: on[0])
    for flag in under:
        on[0] = flag
        session.generation_begin(None, (torch.zeros(1, 3, dtype=torch.long),))
        session.forward_end()
        session.generation_end()
    on[0] = False


def test_generations_under_the_users_profiler_are_never_timed_not_even_in_warm_up(tmp_path, monkeypatch):
    """The lesson as printed: every generate() inside the user's profiler. The warm-up generation used
    to be timed (10 s under the profiler) and shown as a 'first call' figure beside a note saying every
    generation ran outside it; now nothing is timed and the message says no clean figure exists."""
    ticks = [0.0, 5.0, 10.0]  # the warm-up generation: start, forward's end, end (10 s under the profiler)
    session = _session(tmp_path, "infer", ticks, warmup=1)
    _generations(session, [True, True, True], monkeypatch)
    assert session.finish("the script ended") is None
    assert "your own torch.profiler was running for 3 generation(s)" in (session.message or "")
    assert "no clean figure exists" in (session.message or "")
    assert not session.timings.rough_gens and not session.timings.gens


def test_a_rough_figure_comes_only_from_generations_outside_the_users_profiler(tmp_path, monkeypatch):
    """Warm-up 2: the first generation under the user's profiler (10 s), the second outside it (1 s).
    The run's first-call figure is the second's, never the first's."""
    ticks = [0.0, 5.0, 10.0,  # generation 1, under the profiler: never timed (its marks are still read)
             10.0, 10.5, 11.0]  # generation 2, outside it
    session = _session(tmp_path, "infer", ticks, warmup=2)
    _generations(session, [True, False], monkeypatch)
    measured = session.finish("the script ended")
    assert measured is not None
    assert [g.e2e_s for g in measured.timings.gens] == [pytest.approx(1.0)]
    assert measured.timings.first_call == "warm-up"
    assert any("1 generation(s): lmprof stepped aside" in n for n in measured.notes)


def test_a_training_step_under_the_users_profiler_in_warm_up_is_counted_untimed(tmp_path, monkeypatch):
    """Training, warm-up 2: step 1 (begun by the session) under the user's profiler, step 2 outside."""
    on = [True]
    monkeypatch.setattr(giveway, "user_profiler_active", lambda: on[0])
    ticks = [0.0, 10.0, 11.0, 11.0, 11.0]  # step 1's start, its end (under the profiler), step 2's end, spares
    session = _session(tmp_path, "train", ticks, warmup=2)
    session.begin()
    session.boundary()  # step 1 ends under the profiler
    on[0] = False
    session.boundary()  # step 2 ends; its start ran under the profiler too (the mark it starts from)
    measured = session.finish("the script ended")
    assert measured is None and session.k == 2  # both counted as warm-up, neither timed
    assert "was running for 2 step(s)" in (session.message or "")


def _decode(tmp_path: Path, model: torch.nn.Module, generations: int, before: Any = None, **counts: int) -> Any:
    """A hand-written greedy decode loop under lmprof.profile(infer=True): 3 forwards on a 4-token prompt
    per generation (``before`` called first in each); the run it wrote."""
    import lmprof

    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, report=False, verbose=False,
                                         **counts) as prof:
        for _ in range(generations):
            if before is not None:
                before()
            ids = torch.zeros(1, 4, dtype=torch.long)
            for _ in range(3):
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
            prof.step()
    assert prof.run is not None, prof.message
    return prof.run


def test_two_generations_at_warmup_0_steps_0_profile_steps_1_are_measured(tmp_path):
    """Item 9: the plan asks for the profiler's warm-up and one profiled generation, and gets both:
    a run with its profile and a rough e2e marked first_call (it was never 'lower --warmup', already 0)."""
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).eval()
    run = _decode(tmp_path, model, 2, warmup=0, steps=0, profile_steps=1)
    e2e = run.metrics["e2e_latency"]
    assert e2e.basis == "first_call" and e2e.n == 1 and "under lmprof's profiler" in (e2e.note or "")
    assert {b.phase for b in run.blocks} >= {"prefill", "decode"}


@pytest.mark.parametrize("basis,note,marked", [
    ("first_call", "timed on the very first call", True),  # the field decides, whatever the note says
    ("clean", "first call of the day", False),
    (None, "first call: includes warm-up costs (an older run.json)", True),  # before the field: the note
    (None, "from one optimizer step's end to the next's", False),
])
def test_first_call_is_read_from_the_records_basis_and_old_notes(basis, note, marked):
    from lmprof.analysis.marks import FIRST_CALL, marks
    from lmprof.record.run import Env, Metric, Run

    env = Env(device="cpu", device_name="cpu", torch="2", python="3", lmprof="0", os="linux", cpu="x", threads=1)
    run = Run(id="r", mode="train", created="now", env=env, config={},
              metrics={"step_time": Metric(value=1.0, unit="ms", source="measured", note=note, basis=basis)})
    assert (FIRST_CALL in marks(run, "step_time", "ms")) is marked
    assert Run.model_validate_json(run.model_dump_json()).metrics["step_time"].basis == basis


def _loop(tmp_path: Path, calls_model: bool, **counts: int):
    import lmprof

    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).eval()
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, report=False, verbose=False,
                                         **counts) as prof:
        for _ in range(4):
            if calls_model:
                model(torch.zeros(1, 4, dtype=torch.long))
            prof.step()
    return prof


def test_a_run_that_measured_nothing_leaves_no_folder_behind(tmp_path):
    """Item 8: a loop whose generations lmprof cannot time left a folder with the profiled window's
    trace and no run.json. Nothing measured: the folder goes, trace and all."""
    prof = _loop(tmp_path / "runs", calls_model=False, warmup=0, steps=1, profile_steps=1)
    assert prof.run is None and "nothing measured" in (prof.message or "")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_run_that_failed_while_written_is_marked_incomplete_with_what_it_holds(tmp_path, monkeypatch, capsys):
    """A failure while the run is assembled (here its compile report: a figure's failure leaves the run written,
    test_written_when_complete.py) leaves the folder marked INCOMPLETE, the reason and its files named: never a
    folder that looks like a run and is not one."""
    from lmprof.pipeline.protocol.finish import assemble

    def broken(*args, **kwargs):
        raise ValueError("a figure lmprof could not make")

    monkeypatch.setattr(assemble, "add_compile_report", broken)
    prof = _loop(tmp_path / "runs", calls_model=True, warmup=1, steps=1, profile_steps=1)
    assert prof.run is None
    (folder,) = (tmp_path / "runs").iterdir()
    assert not (folder / "run.json").exists()
    text = (folder / "INCOMPLETE").read_text()
    assert "a figure lmprof could not make" in text and "trace.json" in text
    assert "lmprof: could not write the report" in capsys.readouterr().err


def test_a_whole_run_leaves_no_incomplete_mark(tmp_path):
    prof = _loop(tmp_path / "runs", calls_model=True, warmup=1, steps=1, profile_steps=1)
    assert prof.run is not None and prof.folder is not None
    assert (prof.folder / "run.json").is_file() and not (prof.folder / "INCOMPLETE").exists()


def test_prefill_only_generations_are_written(tmp_path):
    """generate(max_new_tokens=1): each generation is its prefill; the decode figures are n/a with the
    reason, and the run is written (it failed on decode_tokens=0 and left a half-written folder)."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmprof.pipeline.protocol.spec import Spec
    from lmprof.pipeline.protocol.triggers import GenerateTrigger

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)).eval()
    session = Session(Spec(mode="infer", warmup=1, steps=2, profile_steps=1, out=tmp_path / "runs", report=False,
                           verbose=False, energy="off"))
    assert GenerateTrigger(session).install()
    ids = torch.randint(0, 64, (1, 5))
    for _ in range(4):
        model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
    session.finish("the loop ended")
    run = session.run
    assert run is not None, session.message
    assert run.metrics["tpot"].value is None and run.metrics["ttft"].n == 2
    assert run.metrics["decode.mfu"].value is None and "prefill only" in (run.metrics["decode.mfu"].note or "")
    assert run.value("prefill.mfu") is not None


# -- the user's program unchanged: its exit code, its threads (item 13) ------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402

from tests.test_usercode import _env, write  # noqa: E402

STEPS = """
import sys, torch
m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step():
    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
"""


def _lmprof_run(tmp_path: Path, script: Path, *args: str) -> int:
    from lmprof.cli.main import main

    return main(["run", "--out", str(tmp_path / "runs"), "--no-report", "--warmup", "1", "--steps", "2",
                 "--profile-steps", "1", str(script), *args])


def _runs(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if (p / "run.json").is_file()] if out.is_dir() else []


def test_a_script_that_closes_stderr_keeps_its_exit_code(tmp_path, monkeypatch, capfd):
    """The script closes sys.stderr and exits 4 (as under plain python: its own exit code); lmprof's
    summary came after and failed on the closed stream, which made the exit code lmprof's 1. lmprof's
    lines now go to descriptor 2, which closing sys.stderr leaves open. The run is written as its window
    completes, before the script closes the stream (which then has the summary); a window still open when
    the stream closes is written at the end, to descriptor 2."""
    import io

    class Kept(io.BytesIO):
        text = b""

        def close(self) -> None:
            Kept.text = self.getvalue()
            super().close()

    for steps, before in ((8, True), (3, False)):
        script = write(tmp_path, "close.py", STEPS + f"for _ in range({steps}):\n    step()\nsys.stderr.close()\nsys.exit(4)\n")
        monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(Kept()))  # the stream the script closes
        assert _lmprof_run(tmp_path, script) == 4
        assert len(_runs(tmp_path / "runs")) == 1
        err = capfd.readouterr().err
        assert ("run folder:" in Kept.text.decode()) is before and ("run folder:" in err) is not before, (steps, err)
        shutil.rmtree(tmp_path / "runs")


def test_lmprof_profile_inside_lmprof_run_stands_aside(tmp_path, capsys):
    """A script using lmprof.profile() itself, run under lmprof run: the script's own exit code (0, it
    used to be 1: a ConfigError raised into it), one run (lmprof run's), one line saying the inner is idle."""
    script = write(tmp_path, "inner.py", STEPS + """
import lmprof
with lmprof.profile(m, out=sys.argv[1], report=False) as prof:
    for _ in range(8):
        step(); prof.step()
print("inner run:", prof.run)
""")
    assert _lmprof_run(tmp_path, script, str(tmp_path / "inner")) == 0
    out, err = capsys.readouterr()
    assert "inner run: None" in out and "lmprof.profile() is idle" in err
    assert len(_runs(tmp_path / "runs")) == 1 and not _runs(tmp_path / "inner")


def test_two_threads_entering_lmprof_profile_at_once(tmp_path):
    """Both threads enter lmprof.profile() at the same moment (a barrier): one measures, the other stands
    aside, both loops finish. Two sessions at once started two kineto profilers: a segfault, or a
    ConfigError raised into one thread, whose loop then never ran. A second barrier holds both inside
    their with-blocks until both have entered: without it, a thread descheduled after the first barrier
    could enter after the other's whole session had ended, and rightly measure too (once in 8 clean runs)."""
    script = write(tmp_path, "threads.py", """
import sys, threading, torch, lmprof
barrier, inside = threading.Barrier(2), threading.Barrier(2)
def work(k):
    m = torch.nn.Linear(16, 16); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    barrier.wait()
    with lmprof.profile(m, out=sys.argv[1], report=False, verbose=False, warmup=1, steps=2, profile_steps=1) as prof:
        inside.wait()
        for _ in range(8):
            m(torch.randn(8, 16)).sum().backward(); opt.step(); opt.zero_grad(); prof.step()
    print("thread", k, "done", prof.run is not None, flush=True)
ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
""")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = sorted(line.split(" ", 2)[2] for line in done.stdout.splitlines() if line.startswith("thread"))
    assert lines == ["done False", "done True"], done.stdout + done.stderr[-2000:]
    assert len(_runs(tmp_path / "runs")) == 1


# -- users' loops counted as the loop is written (item 13) -------------------------------------------
LOOPS = """
import sys, torch
from torch import nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
kind, iterations = sys.argv[1], int(sys.argv[2])
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32); self.l1 = nn.Linear(32, 32); self.l2 = nn.Linear(32, 32); self.head = nn.Linear(32, 100)
    def forward(self, x):
        h = self.emb(x)
        if kind == "checkpoint":  # two checkpointed layers, reentrant: each backward runs a backward inside
            h = checkpoint(self.l1, h, use_reentrant=True)
            h = checkpoint(self.l2, h, use_reentrant=True)
        else:
            h = self.l2(self.l1(h))
        return self.head(h)
m = Net()
def make(): return torch.optim.LBFGS(m.parameters(), max_iter=4) if kind == "lbfgs" else torch.optim.SGD(m.parameters(), lr=0.01)
opt = make()
def loss_of(x): return nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
for i in range(iterations):
    if kind == "recreated" and i % 4 == 0:
        opt = make()  # a new optimizer every epoch of 4 batches
    x = torch.randint(0, 100, (32, 1))  # a batch of 32 tokens
    if kind == "lbfgs":
        def closure():
            opt.zero_grad(); loss = loss_of(x); loss.backward(); return loss
        opt.step(closure)
        continue
    if kind == "accumulation":  # the truth that stays: two batches of 32 per optimizer step
        for _ in range(2):
            loss_of(torch.randint(0, 100, (32, 1))).backward()
    else:
        loss = loss_of(x)
        if kind == "two backward":
            loss.backward(retain_graph=True)
        loss.backward()
    opt.step()
    if kind == "two steps":
        opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("kind,tokens", [("checkpoint", 32), ("two backward", 32), ("lbfgs", 32),
                                         ("accumulation", 64), ("two steps", 32), ("plain", 32)])
def test_tokens_per_step_are_the_batches_the_loop_feeds(tmp_path, kind, tokens):
    """Truth: the loop above (32 tokens a batch; two batches per step only when it accumulates). A
    reentrant checkpoint, a second backward on one forward and LBFGS's closure were taken for gradient
    accumulation (96, 64, 128 tokens); opt.step() twice per batch gave tokens/s 0. A step is one pass
    of the loop: an optimizer step with no forward since the last one belongs to the next step."""
    from lmprof.record.run import Run

    script = write(tmp_path, "loop.py", LOOPS)
    assert _lmprof_run(tmp_path, script, kind, "9") == 0
    (folder,) = _runs(tmp_path / "runs")
    run = Run.load(folder)
    assert run.value("tokens_per_step") == tokens
    assert (run.value("tokens_per_s") or 0) > 0
    accumulation = [n for n in run.notes if n.startswith("gradient accumulation")]
    assert bool(accumulation) == (kind == "accumulation"), run.notes
    if kind == "two steps":  # both optimizer steps of a pass in one lmprof step
        steps = {o.name: o.calls for o in run.ops if o.name.startswith("Optimizer.step#SGD")}
        assert steps and set(steps.values()) == {2}, steps


def test_an_optimizer_re_created_every_epoch_keeps_the_window_going(tmp_path):
    """A new optimizer for the same parameters every 4 batches: its steps are the run's steps. The
    window ended with the first optimizer (4 steps: 3 of 4 clean, none profiled)."""
    from lmprof.record.run import Run

    script = write(tmp_path, "loop.py", LOOPS)
    assert _lmprof_run(tmp_path, script, "recreated", "12") == 0
    (folder,) = _runs(tmp_path / "runs")
    run = Run.load(folder)
    assert run.metrics["step_time"].n == 2 and run.blocks  # warm-up 1, 2 clean, the profiler's warm-up, 1 profiled
    assert any(n.startswith("the optimizer was re-created") for n in run.notes)


# -- the memory comparison names what a loop keeps alive (item 6) ------------------------------------
def _hf_loop(tmp_path: Path, keep: bool):
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    import lmprof

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=1000, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with lmprof.profile(model, out=tmp_path / ("keep" if keep else "drop"), warmup=2, steps=1, profile_steps=1,
                        report=False, verbose=False) as prof:
        for _ in range(5):
            x = torch.randint(0, 1000, (4, 16))
            if keep:  # the lecture's loop: outputs (and its logits) alive until the step ends
                outputs = model(x, labels=x)
                loss = outputs.loss
            else:
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.run is not None, prof.message
    return prof.run


def test_logits_kept_alive_by_the_loop_are_named_with_their_bytes(tmp_path):
    """Hand count: the logits are 4 x 16 x 1000 fp32 = 256,000 B. The loop that keeps ``outputs``
    measures exactly that much more activation memory than the one that keeps only the loss; the run
    names the tensor and its bytes, and the estimate of that loop counts them (it used to assume them
    freed at the loss: activations +38% at the slide's size, unexplained)."""
    logits = 4 * 16 * 1000 * 4
    keep, drop = _hf_loop(tmp_path, keep=True), _hf_loop(tmp_path, keep=False)
    assert keep.value("memory.activations") - drop.value("memory.activations") == logits
    (note,) = [n for n in keep.notes if n.startswith("memory: the loop keeps")]
    assert "logits [4, 16, 1000] float32 = 4 x 16 x 1000 x 4 B" in note
    assert not [n for n in drop.notes if n.startswith("memory: the loop keeps")]
    assert keep.value("memory.estimated.activations") - drop.value("memory.estimated.activations") == logits
    (row,) = [r for r in keep.tables["memory"] if r["category"] == "activations"]
    assert abs(row["diff_pct"]) < 1  # the loop's estimate now matches what it measures


def test_a_submodule_called_before_the_model_does_not_pass_for_a_forward_loop(tmp_path):
    """An encoder-decoder's generate() calls its encoder before the model: a submodule call outside the
    model's own call is no proof of model.forward(x). The model's own call, when it comes, decides:
    the forwards are the model's (3 per generation, on the 4-token prompt, as the loop makes them)."""

    class EncoderDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Linear(8, 8)
            self.embed, self.head = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    model = EncoderDecoder().eval()
    # the encoder, called on its own first in each generation
    run = _decode(tmp_path, model, 5, before=lambda: model.encoder(torch.zeros(1, 8)), warmup=1, steps=2,
                  profile_steps=1)
    assert run.metrics["tpot"].n == 2 * 2 and run.config["new_tokens"] == 3
    assert (run.config["batch_size"], run.config["seq_len"]) == (1, 4)


def test_the_held_tensor_watch_installs_no_global_autograd_hook(tmp_path):
    """Code that disables saved-tensor hooks (compiled code tracing, vmap) raises when any are installed:
    the figures step looks for held tensors without them, so such a model trains under lmprof as without."""
    import lmprof

    class Guarded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"):  # raises if any are on
                return self.lin(x)

    model = Guarded()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with lmprof.profile(model, out=tmp_path, warmup=2, steps=1, profile_steps=1, report=False, verbose=False) as prof:
        for _ in range(5):
            out = model(torch.randn(4, 8))
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.run is not None, prof.message
    (held,) = [row["held"] for row in prof.run.tables["memory_measured"]]
    assert held == [{"name": "output", "shape": [4, 8], "dtype": "float32", "bytes": 4 * 8 * 4}]  # `out`, kept


def test_an_inference_tensor_batch_is_counted_without_breaking_the_step(tmp_path):
    """A batch made under torch.inference_mode has no version counter (reading it raises): the batch
    count must not raise inside the user's forward. Two forwards on it are one batch of 4 x 8 tokens."""
    import lmprof

    model = torch.nn.Sequential(torch.nn.Embedding(50, 8).requires_grad_(False), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with lmprof.profile(model, out=tmp_path, warmup=1, steps=1, profile_steps=1, report=False, verbose=False) as prof:
        for _ in range(4):
            with torch.inference_mode():
                ids = torch.randint(0, 50, (4, 8))  # a frozen embedding saves no indices: autograd accepts it
            model(ids).sum().backward()
            model(ids).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.run is not None, prof.message
    assert prof.run.value("tokens_per_step") == 4 * 8
