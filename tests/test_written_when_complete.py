"""In someone else's loop the run is written as the profiled window completes, not when the loop ends: a
script killed afterwards (SIGKILL, the OOM killer, ``os._exit``) kept nothing. Truth: the script itself
looks for run.json on disk after each of its steps, and a process that leaves by ``os._exit``."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import pytest
import torch

import lmprof
from lmprof.record.run import Run

FAST = ("--warmup", "1", "--steps", "2", "--profile-steps", "1")
LOOP = """
import glob, json, os, sys, torch
m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
runs = os.path.join(os.path.dirname(sys.argv[1]), "runs")
seen = None
for i in range(int(sys.argv[2])):
    m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
    if seen is None and glob.glob(os.path.join(runs, "*", "run.json")):
        seen = i  # the pass after whose optimizer step run.json was on disk
json.dump({"seen": seen}, open(sys.argv[1], "w"))
print("done", flush=True)
if len(sys.argv) > 3:
    os._exit(int(sys.argv[3]))
"""


def test_lmprof_run_writes_the_run_inside_the_step_that_completes_the_window(run_script):
    r = run_script(LOOP, *FAST, args=("12",))
    assert r.code == 0 and r.out == "done\n" and r.record is not None
    # The first optimizer step ends the warm-up step (begun with the session), then 2 clean, the profiler's
    # warm-up and 1 profiled step: the window completes at the fifth optimizer step (pass 4), and the run is
    # on disk right after it, with seven passes to go.
    assert r.own == {"seen": 4}, r.err
    assert r.record["metrics"]["step_time"]["n"] == 2


def test_a_script_that_leaves_by_os_exit_after_the_window_keeps_its_run(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    done = subprocess.run([sys.executable, "-m", "lmprof", "run", "--no-report", "--out", str(tmp_path / "runs"), *FAST,
                           str(script), str(tmp_path / "own.json"), "20", "5"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 5 and done.stdout == "done\n", done.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    run = Run.load(folder)  # a whole run: no INCOMPLETE mark, every figure of the window
    assert not (folder / "INCOMPLETE").exists() and run.metrics["step_time"].n == 2 and run.blocks
    assert (folder / "trace.json.gz").is_file()


def _profiled_loop(out, passes: int, after_step=lambda i, prof: None, **options) -> None:
    """A small model's training loop under lmprof.profile() (1 warm-up, 2 clean, 1 profiled step; ``options``:
    lmprof.profile's others)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"report": False, "verbose": False, **options}
    with lmprof.profile(model, out=out, warmup=1, steps=2, profile_steps=1, **options) as prof:
        for i in range(passes):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
            after_step(i, prof)


def test_lmprof_profile_has_its_run_before_the_with_block_ends(tmp_path):
    written: list[int] = []

    def look(i, prof):
        if not written and prof.run is not None:
            written.append(i)
            assert (prof.folder / "run.json").is_file()

    _profiled_loop(tmp_path, 10, look)
    # 1 warm-up, 2 clean, the profiler's warm-up, 1 profiled: the fifth prof.step() completes the window
    assert written == [4]


def test_a_watched_script_killed_after_the_window_keeps_the_windows_run_beside_its_series(tmp_path):
    """With --watch the run is written again, with the watch's section, when the script ends; one that never
    ends (os._exit here, SIGKILL alike) keeps the measured window's run.json and the watch's own files."""
    pytest.importorskip("pyarrow")
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    done = subprocess.run([sys.executable, "-m", "lmprof", "run", "--no-report", "--watch", "--out",
                           str(tmp_path / "runs"), *FAST, str(script), str(tmp_path / "own.json"), "40", "7"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 7 and done.stdout == "done\n", done.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    run = Run.load(folder)
    assert run.watch is None and run.metrics["step_time"].n == 2 and run.blocks  # the window's, whole
    assert not (folder / "INCOMPLETE").exists() and (folder / "watch" / "watch.json").is_file()
    assert "lmprof train" not in done.stderr  # the summary waits for the end, which never came


@contextlib.contextmanager
def signal_as_the_run_is_written(monkeypatch, signum: int, handler):
    """``signum`` raised as lmprof begins to write the run (``handler`` installed for it meanwhile)."""
    from lmprof.pipeline.protocol.finish import write as write_module

    real = write_module.write

    def interrupted(run, folder, spec):
        signal.raise_signal(signum)
        real(run, folder, spec)

    monkeypatch.setattr(write_module, "write", interrupted)
    own = signal.signal(signum, handler) if handler is not None else None
    try:
        yield
    finally:
        if own is not None:
            signal.signal(signum, own)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_that_arrives_while_the_run_is_written_waits_for_the_write(tmp_path, monkeypatch, signum):
    """A Ctrl-C (or a kill) in the middle of writing the run interrupted the write: the folder kept a trace and
    no run.json, nor the INCOMPLETE mark that says so. Now the signal is held: the run is written whole, then
    the signal takes effect through the handler that was there (KeyboardInterrupt; the script's own)."""
    seen: list[tuple[int, bool]] = []
    own = None if signum == signal.SIGINT else (lambda n, f: seen.append((n, any(tmp_path.glob("*/run.json")))))
    with signal_as_the_run_is_written(monkeypatch, signum, own):
        with pytest.raises(KeyboardInterrupt) if signum == signal.SIGINT else contextlib.nullcontext():
            _profiled_loop(tmp_path, 8)
    (folder,) = tmp_path.iterdir()
    assert Run.load(folder).metrics["step_time"].n == 2 and not (folder / "INCOMPLETE").exists()
    if signum == signal.SIGTERM:
        assert seen == [(signal.SIGTERM, True)]  # the script's own handler ran once, after run.json was there


class GracefulExit(Exception):
    """What a training script's own SIGTERM handler raises to leave its loop and save a checkpoint."""


def _raise(exc: Exception):
    def handler(signum, frame):
        raise exc
    return handler


def test_a_scripts_signal_handler_that_raises_reaches_the_script_after_the_write(tmp_path, monkeypatch):
    """The held signal's handler runs inside lmprof's hook; an exception it raises is the script's (its way out of
    the loop), not lmprof's failure: it was taken for one, said in a line and swallowed, and the loop went on."""
    passes: list[int] = []
    with signal_as_the_run_is_written(monkeypatch, signal.SIGTERM, _raise(GracefulExit("checkpoint and leave"))):
        with pytest.raises(GracefulExit, match="checkpoint and leave"):
            _profiled_loop(tmp_path, 12, lambda i, prof: passes.append(i))
    assert passes == [0, 1, 2, 3]  # it left in the step that completed the window (the fifth), as it asked
    (folder,) = tmp_path.iterdir()
    assert Run.load(folder).metrics["step_time"].n == 2


def test_an_alarm_whose_handler_raises_inside_lmprofs_hook_is_the_scripts(tmp_path, monkeypatch, capsys):
    """A per-step timeout the script set with signal.alarm fires while lmprof's hook runs (here: as the run is
    written; SIGALRM is not held): the TimeoutError its handler raises goes to the script, which asked for it, and
    lmprof ends its measurement with one line, the folder marked for what it holds."""
    with signal_as_the_run_is_written(monkeypatch, signal.SIGALRM, _raise(TimeoutError("step took too long"))):
        with pytest.raises(TimeoutError, match="step took too long"):
            _profiled_loop(tmp_path, 12)
    err = capsys.readouterr().err
    assert "lmprof: could not write the report (TimeoutError: step took too long)" in err, err
    (folder,) = tmp_path.iterdir()
    assert (folder / "INCOMPLETE").is_file() and not (folder / "run.json").exists()


@contextlib.contextmanager
def _full_collections(at: list[int], steps: list[int]):
    """Records the step (``steps``' length) at which each full collection starts, with automatic collection off,
    so only the ones someone asked for run."""
    import gc

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            at.append(len(steps))

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.callbacks.append(seen)
    try:
        yield
    finally:
        gc.callbacks.remove(seen)
        if was:
            gc.enable()


@pytest.mark.parametrize("watch", [False, True])
def test_a_full_collection_after_the_write_only_where_the_watch_goes_on(tmp_path, watch):
    """A watched loop gets the write's garbage collected at once, not by a later, watched step (read as a
    spike); a loop nobody watches is not made to pay a full collection (0.15-0.3 s with transformers loaded)."""
    at: list[int] = []
    steps: list[int] = []
    with _full_collections(at, steps):
        _profiled_loop(tmp_path, 8, lambda i, prof: steps.append(i),
                       **({"watch": True, "watch_max_captures": 0} if watch else {}))
    # the window completes at the fifth prof.step() (as above), with four steps behind it; one at the first
    # step's end may choose among optimizers that earlier tests left
    assert [n for n in at if n > 0] == ([4] if watch else []), at


def test_a_formula_that_fails_leaves_the_measured_run_written(tmp_path, monkeypatch):
    """A figure's formula that raises (an fp64 model's memory estimate once did) lost the whole run: now the step
    time and the blocks are written, and a note says which figures are missing and why."""
    import lmprof.pipeline.protocol.finish.figures as figures
    from lmprof.errors import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("a formula that cannot take this model")

    monkeypatch.delenv("LMPROF_DEBUG", raising=False)
    monkeypatch.setattr(figures, "_estimate", refuse)
    _profiled_loop(tmp_path, 6)
    (folder,) = tmp_path.iterdir()
    run = Run.load(folder)
    assert run.metrics["step_time"].value > 0 and run.blocks
    (note,) = [n for n in run.notes if n.startswith("some figures were not computed")]
    assert "ConfigError: a formula that cannot take this model" in note


def test_a_failing_formulas_long_message_is_one_short_line_in_the_note(tmp_path, monkeypatch):
    import lmprof.pipeline.protocol.finish.figures as figures

    def refuse(*args, **kwargs):
        raise ValueError("tensor([" + ",\n ".join(["0.1234"] * 5000) + "])")

    monkeypatch.delenv("LMPROF_DEBUG", raising=False)
    monkeypatch.setattr(figures, "_estimate", refuse)
    _profiled_loop(tmp_path, 6)
    (folder,) = tmp_path.iterdir()
    (note,) = [n for n in Run.load(folder).notes if n.startswith("some figures were not computed")]
    assert "\n" not in note and len(note) < 500 and "ValueError: tensor([0.1234, 0.1234" in note
