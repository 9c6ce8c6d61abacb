"""The ``lmprof`` command holds Python's collector off while it starts up, and hands the user's script
(and every measured step) a process that collects as any other: the truth is ``gc.isenabled()`` as the
script itself sees it. In the caller's own process (``lmprof.profile()``, ``main([...])``) lmprof never
touches the collector."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import lmprof
from lmprof import gc_hold
from lmprof.cli.main import main
from tiny_loops import sgd_steps

SRC = Path(__file__).resolve().parents[1] / "src"

SCRIPT = """
import gc, json, sys, torch
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
m = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(5):
    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
    assert gc.isenabled()  # every step, measured or not
"""


def test_the_users_script_runs_with_the_collector_on(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lmprof", "run", "--no-report", "--out", str(tmp_path / "runs"),
                           "--warmup", "1", "--steps", "2", "--profile-steps", "1", str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[0])
    # on, and what lmprof's start-up imported (torch among it) frozen rather than walked again
    assert seen["enabled"] is True and seen["frozen"] > 100_000, seen
    assert (next((tmp_path / "runs").iterdir()) / "run.json").is_file()


def test_in_the_callers_process_the_collector_is_left_alone(tmp_path: Path) -> None:
    frozen = gc.get_freeze_count()
    assert gc.isenabled() and not gc_hold.held()
    model = torch.nn.Linear(4, 4)
    with lmprof.profile(model, warmup=1, steps=2, profile_steps=1, out=tmp_path / "p", verbose=False,
                        report=False) as prof:
        sgd_steps(model, prof)
    assert main(["results", str(tmp_path / "p")]) in (0, 2)  # main([...]) in-process: no hold either
    # nothing frozen by lmprof (a freeze would take in every object created since); frozen objects
    # freed meanwhile leave the count
    assert gc.isenabled() and gc.get_freeze_count() <= frozen


def test_hold_and_release() -> None:
    was = gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        gc_hold.hold()
        assert not gc.isenabled() and gc_hold.held()
        gc_hold.release()
        assert gc.isenabled() and not gc_hold.held() and gc.get_freeze_count() >= frozen
        gc_hold.release()  # a second release changes nothing
        assert gc.isenabled()
        gc.disable()
        gc_hold.hold()  # off already (the process's own choice): not ours to turn on later
        gc_hold.release()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_verb_that_measures_nothing_gets_the_collector_back_before_it_runs(tmp_path: Path) -> None:
    """What the console command does after its hold: ``report``, ``results``, ... get collection back
    before their command (plots make cycles only the collector frees); ``train`` keeps it held into its
    command, through torch's import, until its session starts."""
    try:
        gc_hold.hold()
        assert main(["results", str(tmp_path / "nothing")]) == 2
        assert gc.isenabled() and not gc_hold.held()
        gc_hold.hold()
        assert main(["train", "--no-such-option"]) == 2  # refused before any session
        assert gc_hold.held() and not gc.isenabled()
    finally:
        gc_hold.release()
    assert gc.isenabled()


def test_the_torchrun_agent_runs_with_the_collector_on_and_its_imports_frozen() -> None:
    from lmprof.pipeline.distributed import torchrun_command

    assert torchrun_command(2, ["train"])[1:3] == ["-m", "lmprof.pipeline.torchrun_agent"]
    probe = ("import gc, json, lmprof.pipeline.torchrun_agent as a, torch.distributed.run as r; "
             "print(json.dumps([gc.isenabled(), gc.get_freeze_count(), a.main is r.main]))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    enabled, frozen, same_main = json.loads(done.stdout)
    assert enabled is True and frozen > 100_000 and same_main is True
