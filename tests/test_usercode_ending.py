"""How a profiled script ends: signals, forks, --stop-after in a loop that catches everything, a
profile() used twice. Each runs the CLI in a subprocess (a signal or a fork must not hit pytest);
the truths are the script's own output, its exit status and the folders on disk."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.record.run import Run
from tests.test_usercode import _env, write

LOOP = """
import os, signal, sys, torch
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
mode, n = sys.argv[1], int(sys.argv[2])
at = [int(a) for a in sys.argv[3].split(",")] if len(sys.argv) > 3 else [4]
for i in range(n):
    try:
        m(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    except:  # noqa: E722 - the lesson's bare except
        print("caught", flush=True)
    if i in at and mode in ("TERM", "INT"):
        print("signalling", flush=True)
        os.kill(os.getpid(), getattr(signal, "SIG" + mode))
    if i in at and mode == "fork":
        pid = os.fork()
        if pid == 0:
            m(torch.randn(4, 16)).sum().backward()
            opt.step()
            print("child", flush=True)
            sys.exit(0)
        os.waitpid(pid, 0)
print("loop done")
"""

FAST = ["--no-report", "--steps", "2", "--warmup", "1", "--profile-steps", "2"]


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = write(tmp_path, "loop.py", LOOP)
    flags = [a for a in args if a.startswith("--")]
    own = [a for a in args if not a.startswith("--")]
    return subprocess.run([sys.executable, "-m", "lmprof", "run", "--out", str(tmp_path / "runs"), *FAST, *flags,
                           str(script), *own], capture_output=True, text=True, timeout=120, env=_env(),
                          preexec_fn=sigint_default)


def sigint_default() -> None:
    # A shell that starts the suite in the background (`make test &`) passes SIGINT on ignored, and
    # Python then keeps it ignored: the script's own SIGINT would do nothing, with or without lmprof.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def folders(tmp_path: Path) -> list[Path]:
    out = tmp_path / "runs"
    return sorted(p for p in out.iterdir() if (p / "run.json").is_file()) if out.is_dir() else []


@pytest.mark.parametrize("sig", ["TERM", "INT"])
@pytest.mark.slow
def test_signal_writes_what_was_measured_then_dies_of_it(tmp_path: Path, sig: str) -> None:
    """The signal after step 5: in the profiled window, one of two profiled steps complete."""
    proc = run_cli(tmp_path, sig, "100")
    signum = getattr(signal, "SIG" + sig)
    assert proc.returncode == -signum, proc.stderr[-2000:]
    assert proc.stdout == "signalling\n"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lmprof:")]
    assert len(lines) == 1 and f"SIG{sig}" in lines[0] and "wrote what was measured" in lines[0], proc.stderr
    (folder,) = folders(tmp_path)
    assert Run.load(folder).metrics["step_time"].n == 2


@pytest.mark.slow
def test_forked_child_does_nothing_and_does_not_hang(tmp_path: Path) -> None:
    """Forks after step 5 (inside lmprof's profiled window: 1 warm-up + 2 clean + 1 + 2 profiled) and
    after step 9 (the window is over, but the profiler ran in this process), in one script."""
    proc = run_cli(tmp_path, "fork", "12", "4,8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["child", "child", "loop done"]
    (folder,) = folders(tmp_path)
    assert Run.load(folder).blocks


@pytest.mark.slow
def test_stop_after_ends_a_loop_with_bare_except(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "--stop-after", "plain", "1000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loop done" not in proc.stdout and proc.stdout.count("caught") == 1
    assert "lmprof: --stop-after: stopped the script once the run was written" in proc.stderr
    assert len(folders(tmp_path)) == 1


def test_profile_used_in_two_with_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    import lmprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = lmprof.profile(model, out=tmp_path, warmup=0, steps=2, profile_steps=1, report=False)
    runs = []
    for _ in range(2):
        with prof:
            for _ in range(6):
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        runs.append(prof.folder)
        # nothing of lmprof left installed between and after the blocks
        assert not model._forward_hooks and not model._forward_pre_hooks and "zero_grad" not in vars(opt)
        from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

        assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks
    assert runs[0] is not None and runs[1] is not None and runs[0] != runs[1]
    assert "this lmprof.profile() was used before: this with-block is measured as a new run" in capsys.readouterr().err
