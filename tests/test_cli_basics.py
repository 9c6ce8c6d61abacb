"""What every CLI has: ``--version``, shell completion (typer's), and ``dir(lmprof)`` naming the lazy API."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import lmprof
from lmprof.version import __version__

SRC = Path(__file__).resolve().parents[1] / "src"


def test_version(cli) -> None:
    for flag in ("--version", "-V"):
        code, out, err = cli(flag)
        assert (code, out, err) == (0, f"lmprof {__version__}\n", "")


def test_completion_lists_verbs_and_options() -> None:
    """bash completion as the shell asks for it (click's protocol under typer): verbs, then a verb's options."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "_LMPROF_COMPLETE": "complete_bash"}

    def complete(words: str, cword: int) -> list[str]:
        proc = subprocess.run([sys.executable, "-m", "lmprof"], env={**env, "COMP_WORDS": words,
                              "COMP_CWORD": str(cword)}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("lmprof ex", 1) == ["export"]
    assert "--to" in complete("lmprof export runs/x --", 3)


def _under(shell: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``lmprof ARGS`` run from ``shell``, as a user's terminal runs it: typer finds the shell from the process
    tree, and under make or pytest-xdist the nearest one may be sh."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", None)
    # '; exit $?' keeps the shell as the parent (a lone command is exec'd in its place) and lmprof's exit code
    line = shlex.join([sys.executable, "-m", "lmprof", *args]) + "; exit $?"
    return subprocess.run([shell, "-c", line], env=env, capture_output=True, text=True, timeout=60)


def test_show_completion_prints_a_script() -> None:
    proc = _under("bash", "--show-completion")
    assert proc.returncode == 0 and "_LMPROF_COMPLETE=complete_bash" in proc.stdout, proc.stderr


def test_completion_from_a_shell_typer_has_no_script_for_is_one_line_and_exit_2() -> None:
    """Under sh typer printed 'Shell sh not supported.' and exited 1 (lmprof's code for a failed gate)."""
    for flag in ("--show-completion", "--install-completion"):
        proc = _under("sh", flag)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("lmprof: error: shell completion is for bash, zsh, fish and PowerShell; this one is sh")
        assert proc.stdout == ""


def test_dir_names_the_lazy_api() -> None:
    names = dir(lmprof)
    assert {"profile", "profile_training", "profile_inference", "load_run", "load_results", "summary",
            "integrations", "__version__"} <= set(names)
    assert all(hasattr(lmprof, n) for n in lmprof.__all__)
