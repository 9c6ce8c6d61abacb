"""The whole-run watch wired into the protocol: ``lmprof run --watch``, ``lmprof.profile(watch=True)``, the
callbacks and ``--nproc``, each on a script that misbehaves on purpose and checked against what it injected.

Truths: the script's own loss values, tokens (batch x sequence), the bytes it keeps per step, the time
it sleeps before each forward, the step from which it runs an extra matmul in a named module, the rank
that sleeps (in tests/test_usercode.py's one torchrun test); the series files read back with pyarrow;
exit codes and stdout.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import lmprof
from conftest import one_line_error
from record_checks import assert_tables_documented, assert_valid
from lmprof.analysis.watch_capture import profiled_spread
from lmprof.errors import ConfigError
from lmprof.record.run import Run
from lmprof.record.watch import chunk_files, load_section, read_series

SRC = str(Path(__file__).resolve().parents[1] / "src")
COUNTS = dict(warmup=2, steps=5, profile_steps=2)  # the protocol's window: 2 + 5 + 1 + 2 = 10 steps
WINDOW = 10


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 32)
        self.head = torch.nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def test_profile_watch_sees_the_loaders_sleep_and_the_loss(tmp_path: Path, capsys) -> None:
    """A loader that sleeps SLEEP before each forward, and the loss given to prof.step(loss=...): each figure as
    injected. (The bytes a loop keeps: test_run_watch_sees_the_kept_bytes, in a process of their own.)"""
    SLEEP, B, T, STEPS = 0.005, 4, 16, WINDOW + 150
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, ends, waited = {}, [], {}
    with lmprof.profile(model, out=tmp_path / "runs", report=False, watch=True, watch_max_captures=0, **COUNTS) as prof:
        for i in range(STEPS):
            t0 = time.perf_counter()
            time.sleep(SLEEP)  # the data loader
            ids = torch.randint(0, 100, (B, T))
            waited[i + 1] = time.perf_counter() - t0  # the loop's step i is the protocol's step i + 1
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[i + 1] = loss.item()
            prof.step(loss=loss)
            ends.append(time.perf_counter())
        print("the script's own line")
    out, err = capsys.readouterr()
    assert out == "the script's own line\n"  # stdout is the script's own
    run = Run.load(prof.folder)
    w = run.watch
    assert w is not None and w.first_step == WINDOW + 1 and w.last_step == STEPS and not w.captures
    assert not (prof.folder / "INCOMPLETE").exists()
    assert load_section(prof.folder).model_dump() == w.model_dump()  # watch.json: the section, as written
    s = read_series([prof.folder / p for p in w.series])
    steps = s["step"]
    # every step after the window but the first (it pays for the profiler's teardown)
    assert list(steps) == list(range(WINDOW + 2, STEPS + 1))
    # the loss as the script had it, tokens as batch x sequence
    assert np.allclose(s["loss"], [losses[int(k)] for k in steps])
    assert np.all(s["tokens"] == B * T)
    # step time: the same boundaries as the script's own stopwatch (prof.step() returns right after)
    own = np.diff(ends)[steps - 2]  # ends[i] is step i + 1's end
    assert np.median(np.abs(s["step_s"] - own) / own) < 0.05
    # input wait: the loader's sleep (within 10%), each step's the time the loader took by the script's own
    # clock (a loaded machine oversleeps), and an input-bound alert whose figure is the loader's over its steps
    assert np.median(s["input_wait_s"]) == pytest.approx(SLEEP, rel=0.10)
    took = np.array([waited[int(k)] for k in steps])
    assert np.median(np.abs(s["input_wait_s"] - took) / took) < 0.02
    ib = next(a for a in w.alerts if a.kind == "input_bound")
    assert ib.first_step == WINDOW + 2  # from the first step in the series
    lately = [waited[k] for k in range(ib.last_step - 15, ib.last_step + 1)]  # 'mean over the last 16 steps'
    assert ib.evidence["input_wait"].value == pytest.approx(np.mean(lately) * 1e3, rel=0.10)
    assert ib.evidence["input_wait"].unit == "ms"
    # the baseline's wait: the clean steps' (3-7: after 2 warm-up steps), by the loader's own clock, and the
    # alert sets the later waits beside it
    clean = float(np.median([waited[k] for k in range(3, 8)]))
    assert w.baseline is not None and w.baseline.input_wait_s == pytest.approx(clean, rel=0.05)
    assert ib.evidence["baseline_input_wait"].value == pytest.approx(clean * 1e3, rel=0.05)
    assert not [a for a in w.alerts if a.kind == "memory_creep"]
    # the panel said it on stderr (not a terminal: plain lines)
    assert "lmprof watch: watching every step from step 11" in err and "lmprof watch: input bound (steps 12-" in err


KEEPS = """
import mmap, sys, torch
torch.set_num_threads(1)
KEEP, STEPS = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for i in range(STEPS):
    model(torch.randn(8, 32)).pow(2).mean().backward()
    page = mmap.mmap(-1, KEEP)  # fresh pages, every one written: RSS grows by KEEP a step
    page.write(b"\\1" * KEEP)
    kept.append(page)
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow  # a subprocess: scheduled with the long tests first
def test_run_watch_sees_the_kept_bytes(tmp_path: Path) -> None:
    """A loop that keeps KEEP bytes a step: a memory-creep alert whose rate is KEEP within 10%. In a process of
    its own, as a script is: a test worker's RSS moves with what its earlier tests left (heap holes that
    glibc fills before RSS grows, threads still running), and CI once saw no creep in one."""
    KEEP, STEPS = 1024 * 1024, WINDOW + 150
    script = tmp_path / "keeps.py"
    script.write_text(textwrap.dedent(KEEPS))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "lmprof", "run", "--watch", "--no-report", "--out", str(out),
                           "--warmup", "2", "--steps", "5", "--profile-steps", "2", "--watch-max-captures", "0",
                           str(script), str(KEEP), str(STEPS)], capture_output=True, text=True, timeout=240,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    w = Run.load(max(out.iterdir())).watch
    assert w is not None
    creep = [a for a in w.alerts if a.kind == "memory_creep"]
    assert creep and all(a.evidence["rate"].value == pytest.approx(KEEP, rel=0.10) for a in creep)
    assert creep[0].evidence["rate"].unit == "B/step"


DRIFT = """
import os, signal, sys, torch
from torch import nn
torch.set_num_threads(1)
K, TERM = int(sys.argv[1]), int(sys.argv[2])

class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.on = False
        self.w = nn.Parameter(torch.randn(384, 384) * 0.01)
    def forward(self, x):
        if self.on:  # from loop step K: two extra matmuls, the step about 3x slower
            x = x @ self.w @ self.w
        return x

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.slow = nn.Linear(384, 384), Slow()
    def forward(self, x):
        return self.slow(self.a(x))

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(256, 384)
for i in range(100000):
    if i == K:
        model.slow.on = True
    if i == TERM:
        print("sending SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
print("never")
"""


def _watched_drift(tmp_path: Path, k: int, term: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
    script = tmp_path / "drift.py"
    script.write_text(textwrap.dedent(DRIFT))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "lmprof", "run", "--watch", "--no-report", "--out", str(out),
                           "--warmup", "2", "--profile-steps", "2", "--watch-min-gap", "0", str(script), str(k),
                           str(term)], capture_output=True, text=True, timeout=240, env=_env())
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    return max(out.iterdir()), proc


# Alone, in the stopwatch stage: beside the other test worker the 3x slowdown it injects was seen late, or
# not at all, in two of nine clean-clone suites (before and after this round's changes alike), and the
# rounds it reruns did not always clear it
@pytest.mark.stopwatch
def test_run_watch_names_the_module_that_slowed_and_a_sigterm_keeps_the_series(tmp_path: Path) -> None:
    """``lmprof run --watch``: a 3x slowdown from loop step K by a matmul in module ``slow`` is a drift from
    step K + 1, a captured window's diff names ``slow`` and ``aten::mm``; a SIGTERM later ends the script as
    it would without lmprof, with the series, the alerts and the capture on disk.

    A shared machine can slow the steps before K by itself (another process taking the core for a while is
    a drift too, and a real one), or one of the two profiled steps either side of the diff: such a round
    (a drift before K + 1 or after K + 3, one of 2x or less, or none; the diff's names missing in a run lmprof
    itself calls noisy) is run again, up to 3 times."""
    K, TERM = 25, 125  # the watch's first row is step 17: few steps before K for a busy machine to slow
    for _ in range(3):
        folder, proc = _watched_drift(tmp_path, K, TERM)
        run = Run.load(folder)  # written on the SIGTERM, with the watch section
        w = run.watch
        assert w is not None
        early = [a for a in w.alerts if a.kind == "drift" and a.first_step <= K]
        named = {(g.kind, g.name) for c in w.captures for g in c.grew if g.beyond_noise}
        # two profiled steps a side: a disturbed one moves their means and their spread (the diff's noise)
        # enough to hide a growth, and lmprof says so (a noisy run, or profiled steps spread by a quarter)
        spread = max([profiled_spread(run)] + [profiled_spread(Run.load(folder / c.path)) for c in w.captures])
        hidden = not {("block", "slow"), ("operator", "aten::mm")} <= named and (run.noisy or spread > 0.25)
        # steps before K slowed by the machine (the other test worker) make the slowdown the drift reports less
        # than the 3x injected, or hide it (a clean clone's suite once saw no drift in a round)
        drifts = [a for a in w.alerts if a.kind == "drift"]
        blunted = not drifts or drifts[0].evidence["slowdown"].value <= 2.0
        # the other worker's load around the onset can make the rolling median cross late (a clean clone's
        # suite once saw the drift from step 38 for the onset at 26)
        late = bool(drifts) and drifts[0].first_step > K + 3
        if not early and not hidden and not blunted and not late:
            break
    assert proc.stdout == "sending SIGTERM\n"
    assert not (folder / "INCOMPLETE").exists()
    drift = next(a for a in w.alerts if a.kind == "drift")
    assert K + 1 <= drift.first_step <= K + 3  # the loop's step i is the protocol's step i + 1
    assert drift.evidence["slowdown"].value > 2.0 and drift.evidence["slowdown"].unit == "x"
    (cap,) = [c for c in w.captures if c.requested_by == "alert"]
    assert w.alerts[cap.alert] is not None and w.alerts[cap.alert].kind == "drift"
    assert drift.first_step < cap.first_step < TERM
    # seen within two windows of steps of the onset (a loaded machine's slow steps may have brought a look
    # forward just before it): three slow steps in a row bring the detectors' next look forward to when a
    # rolling median can cross; their own period, set by their cost, is a second or two
    assert cap.first_step <= drift.first_step + 2 * 16
    grew = [(g.kind, g.name) for g in cap.grew if g.beyond_noise]
    assert ("block", "slow") in grew and ("operator", "aten::mm") in grew
    mm = next(g for g in cap.grew if g.name == "aten::mm")
    assert mm.after_ms > 2 * mm.before_ms  # one matmul before (the Linear's backward), five after
    child = folder / cap.path
    assert {"run.json", "blocks.csv", "ops.csv", "trace.json.gz"} <= {p.name for p in child.iterdir()}
    # the series so far is whole and readable: every step up to the last one the script finished
    s = read_series(chunk_files(folder))
    assert s["step"][-1] == TERM and np.all(np.diff(s["step"]) > 0)
    assert np.median(s["step_s"][s["step"] > K + 1]) > 2 * np.median(s["step_s"][s["step"] <= K])
    assert json.loads((folder / "watch" / "watch.json").read_text())["alerts"][0]["kind"] == "drift"
    for record in (folder / "run.json", child / "run.json"):  # alerts, a capture, what grew: as published
        assert_valid(record)
        assert_tables_documented(record)


def test_trainer_callback_watch_captures_on_sigusr2_and_a_failing_watch_keeps_the_run(tmp_path: Path, capsys,
                                                                                    monkeypatch) -> None:
    """The Trainer callback's hooks, called as the Trainer calls them: the steps after the window are
    watched, a SIGUSR2 asks for a capture at the next step, and when the watch itself fails later the
    training goes on and the run is still written, with what the watch had."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from lmprof.integrations import TrainerCallback
    from lmprof.measure.watch import Watcher

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cb = TrainerCallback(out=tmp_path / "runs", verbose=False, report=False, watch=True, **COUNTS)
    sent: list[int] = []

    class Sink:  # what --log-to hands the watch (trackers/watch.py), recorded
        def step(self, folder: Path, summary) -> None:
            assert folder == cb.session.folder
            sent.append(summary.step)

        def close(self) -> None:
            sent.append(-1)

    cb.spec.watch.sink = Sink()
    control = SimpleNamespace(should_training_stop=False)
    cb.on_train_begin(None, None, control, model=model, optimizer=opt)
    done = 0
    for i in range(WINDOW + 14):
        if i == WINDOW + 2:
            os.kill(os.getpid(), signal.SIGUSR2)  # at the next boundary, step 13's end: 14 is the warm-up
        if i == WINDOW + 10:
            monkeypatch.setattr(Watcher, "step_end", lambda self, **kw: 1 / 0)
        ids = torch.randint(0, 100, (2, 8))
        model(ids).sum().backward()
        opt.step()
        opt.zero_grad()
        cb.on_step_end(None, None, control)
        done += 1
    cb.on_train_end(None, None, control)
    assert done == WINDOW + 14 and not control.should_training_stop
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # lmprof's handler went with the watch
    err = capsys.readouterr().err
    assert err.count("lmprof: the watch stopped at step 21 (ZeroDivisionError: division by zero); your script "
                     "continues") == 1
    w = Run.load(cb.folder).watch
    assert w is not None and w.first_step == WINDOW + 1
    (cap,) = w.captures
    assert (cap.requested_by, cap.first_step, cap.steps) == ("signal", WINDOW + 5, 2)
    assert Run.load(cb.folder / cap.path).config["capture"]["requested_by"] == "signal"
    assert any(n.startswith("the watch stopped at step 21") for n in w.notes)
    s = read_series([cb.folder / p for p in w.series])
    assert list(s["step"]) == [WINDOW + 2, WINDOW + 3] + list(range(WINDOW + 8, WINDOW + 11))
    # the sink got a step the series has (at most one a second), then its close when the watch stopped
    assert sent[-1] == -1 and sent[:-1] and set(sent[:-1]) <= set(s["step"])


def test_a_crash_in_the_loop_still_writes_the_run_with_the_series_so_far(tmp_path: Path) -> None:
    """While watched, the folder holds the measured window's run.json (no watch section yet) and watch.json:
    what a SIGKILL leaves (until this session it was only marked INCOMPLETE, the window's figures lost);
    the loop raising ends the watch, and the run is written again with every step the loop finished."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(ValueError, match="the script's own"):
        with lmprof.profile(model, out=tmp_path, report=False, verbose=False, watch=True, **COUNTS) as prof:
            for i in range(WINDOW + 20):
                if i == WINDOW + 8:
                    folder = prof.session.folder
                    assert not (folder / "INCOMPLETE").exists() and Run.load(folder).watch is None
                    assert Run.load(folder).metrics["step_time"].n == COUNTS["steps"]
                    assert load_section(folder).first_step == WINDOW + 1
                    raise ValueError("the script's own error")
                model(torch.randint(0, 100, (2, 8))).sum().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    assert not (prof.folder / "INCOMPLETE").exists()
    w = Run.load(prof.folder).watch
    assert w is not None and w.last_step == WINDOW + 8
    assert list(read_series(chunk_files(prof.folder))["step"]) == list(range(WINDOW + 2, WINDOW + 9))


@pytest.mark.parametrize("flags,needle", [
    (["--watch", "--infer"], "generations are not watched"),
    (["--watch", "--stop-after"], "choose one"),
    (["--watch", "--watch-max-captures", "-1"], "--watch-max-captures must be"),
    (["--watch-min-gap", "5"], "add --watch"),
])
def test_what_cannot_be_watched_is_one_line(cli, tmp_path: Path, flags: list[str], needle: str) -> None:
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('the script must not run')\n")
    code, _, err = cli("run", *flags, "--out", tmp_path, script)
    one_line_error(code, err, needle)


def test_profile_refuses_a_watch_it_cannot_keep(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="generations are not watched"):
        lmprof.profile(Net(), out=tmp_path, infer=True, watch=True)
    with pytest.raises(ConfigError, match="watch_min_gap must be a whole number"):
        lmprof.profile(Net(), out=tmp_path, watch=True, watch_min_gap=True)


def test_step_stream_logs_each_step_at_its_index_into_the_runs_tensorboard_folder(tmp_path: Path, monkeypatch):
    """trackers/watch.py's StepStream (``--log-to`` under ``--watch``): each step's scalars at its index,
    in the log folder the run's own export writes to (``tensorboard/<run id>`` from where the script began)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lmprof.record.watch import StepSummary
    from lmprof.trackers.watch import StepStream

    monkeypatch.chdir(tmp_path)
    stream = StepStream(["tensorboard"])
    folder = tmp_path / "runs" / "20260101-000000-train-x-cpu"
    for step, ms in ((20, 10.0), (45, 12.5)):
        stream.step(folder, StepSummary(step=step, step_s=ms / 1e3, loss=2.5, rss_B=1e9))
    stream.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard" / folder.name), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(p.step, p.value) for p in acc.Scalars("watch/step_time_ms")] == [(20, 10.0), (45, 12.5)]
    assert [p.value for p in acc.Scalars("watch/loss")] == [2.5, 2.5]
    assert [p.value for p in acc.Scalars("watch/rss_B")] == [1e9, 1e9]
