"""A clean terminal: torch's C++ log lines about lmprof's own profiler windows (kineto's
``USDT: ... profiler_start``/``profiler_stop``, c10's ``CPUAllocator.cpp`` warning) stay off stderr,
``--verbose`` brings them back, and a user's own profiler keeps its lines. The truth is the stderr
of a real process: these lines are written by C++ straight to file descriptor 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.measure.native_logs import (VERBOSE_ENV, drop_native_lines, is_native_line, native_logs_dropped,
                                        quiet_process)

SRC = Path(__file__).resolve().parents[1] / "src"
# Written by torch 2.13 itself (copied from a terminal), and lines that only look alike.
KINETO = b"USDT:2026-11-26 00:30:59 18148:18148 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
C10 = (b"[W1126 00:37:53.774155731 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
       b"the profiling started, profiler results will not include the deallocation event\n")
USERS = [b"USDT: my own note\n", b"[W1126] not a log line\n", b"epoch 1 loss 2.3\n", b"progress 40%\r"]
NATIVE = ("profiler_start", "profiler_stop", "CPUAllocator.cpp", "SyncActivityProfilerHandler")


def native(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if any(n in ln for n in NATIVE)]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", VERBOSE_ENV)}
    return {**out, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", **extra}


def test_only_the_native_lines_are_dropped():
    assert is_native_line(KINETO) and is_native_line(C10)
    assert not any(is_native_line(u) for u in USERS)
    assert drop_native_lines(b"".join([USERS[0], KINETO, USERS[1], C10, USERS[2], USERS[3]])) == b"".join(USERS)


def test_a_bracket_passes_on_everything_but_the_native_lines(capfd, monkeypatch):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with native_logs_dropped():
        os.write(2, KINETO + USERS[2] + C10)
        print("from python", file=sys.stderr)
    # (pytest's capture keeps Python's stderr apart from fd 2's, so only the set of lines is checked)
    assert sorted(capfd.readouterr().err.splitlines()) == sorted([USERS[2].decode().strip(), "from python"])
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with native_logs_dropped():
        os.write(2, KINETO)
    assert capfd.readouterr().err == KINETO.decode()


def test_quiet_process_keeps_a_users_level_and_leaves_a_process_with_torch_alone(monkeypatch):
    for name in ("KINETO_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", VERBOSE_ENV):
        monkeypatch.delenv(name, raising=False)
    assert "torch" in sys.modules  # this test process: not one lmprof started
    assert quiet_process() == {} and "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")  # as a fresh `lmprof train` sees it; restored after
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    assert quiet_process() == {"TORCH_CPP_LOG_LEVEL": "ERROR"} and os.environ["KINETO_LOG_LEVEL"] == "2"
    monkeypatch.delenv("KINETO_LOG_LEVEL")
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL")
    assert quiet_process(on_verbose=True) == {} and "KINETO_LOG_LEVEL" not in os.environ


TINY = ["--preset", "tiny", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "-t", "8", "--warmup", "0",
        "--steps", "1", "--profile-steps", "1", "--energy", "off", "--no-report"]


@pytest.mark.slow
def test_train_prints_no_native_lines(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lmprof", "train", *TINY, "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert native(done.stderr) == [] and native(done.stdout) == []
    assert done.stdout.startswith("lmprof train — ")  # lmprof's header is the first thing printed


@pytest.mark.slow
def test_verbose_brings_them_back(tmp_path):
    args = ["--preset", "tiny", "--prompt-len", "4",
            "--new-tokens", "2", "--steps", "1", "--warmup", "0", "--energy", "off", "--no-report"]
    done = subprocess.run([sys.executable, "-m", "lmprof", "infer", *args, "--verbose", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = native(done.stderr)
    # Every window lmprof opens (profiler-cost repeats, the memory pass, the profiled phase) says so.
    assert sum("profiler_start" in ln for ln in lines) >= 2, done.stderr[-2000:]


USER_SCRIPT = """
import torch
from torch.profiler import profile, ProfilerActivity
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step():
    m(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
for _ in range(6):
    step()
with profile(activities=[ProfilerActivity.CPU]):   # the user's own, after lmprof's windows
    step()
"""


@pytest.mark.slow
def test_a_users_own_profiler_keeps_its_lines_under_lmprof_run(tmp_path):
    script = tmp_path / "own.py"
    script.write_text(USER_SCRIPT)
    flags = ["--no-report", "--steps", "2", "--warmup", "1", "--profile-steps", "1"]
    done = subprocess.run([sys.executable, "-m", "lmprof", "run", "--out", str(tmp_path / "runs"), *flags, str(script)],
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (next((tmp_path / "runs").iterdir()) / "run.json").is_file()  # lmprof's windows did run
    # The user's own start and stop, exactly as without lmprof; none of lmprof's windows' (its profiled
    # steps, its profiler-cost repeats: --verbose shows those, as test_verbose_brings_them_back does).
    lines = native(done.stderr)
    assert [ln.rsplit("] ", 1)[-1] for ln in lines] == ["profiler_start", "profiler_stop"], done.stderr[-2000:]


@pytest.mark.slow
def test_the_figures_steps_memory_recording_prints_no_allocator_warning_under_lmprof_run(tmp_path):
    # Three steps at the defaults: step 2 is the figures step, recorded with memory events; the first
    # free of a block allocated before it started made c10 warn in the middle of the user's step.
    script = tmp_path / "three.py"
    script.write_text("import torch\nm = torch.nn.Linear(8, 8)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "w = [torch.randn(2, 8) for _ in range(3)]\n"
                      "for x in w:\n    m(x).sum().backward(); opt.step(); opt.zero_grad(); del x\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-m", "lmprof", "run", "--no-report", "--out", str(tmp_path / "runs"),
                           str(script)], capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
    assert (next((tmp_path / "runs").iterdir()) / "run.json").is_file()
    assert native(done.stderr) == [], done.stderr[-2000:]
