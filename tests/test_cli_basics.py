"""What every CLI has: ``--version``, shell completion (typer's), and ``dir(lmprof)`` naming the lazy API."""
from __future__ import annotations

import os
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


def test_show_completion_prints_a_script() -> None:
    """--show-completion is typer's flag for the shell it runs under (found from the process tree), so the
    test runs it from bash as a user would: under make or pytest-xdist the nearest shell may be sh."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", None)
    # '; true' keeps bash as the parent (a lone command is exec'd in bash's place)
    proc = subprocess.run(["bash", "-c", f"'{sys.executable}' -m lmprof --show-completion; true"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "_LMPROF_COMPLETE=complete_bash" in proc.stdout, proc.stderr


def test_completion_from_a_shell_typer_has_no_script_for_is_one_line_and_exit_2() -> None:
    """Under sh typer printed 'Shell sh not supported.' and exited 1 (lmprof's code for a failed gate)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for flag in ("--show-completion", "--install-completion"):
        # '; exit $?' keeps sh as the parent and its exit code as lmprof's
        proc = subprocess.run(["sh", "-c", f"'{sys.executable}' -m lmprof {flag}; exit $?"], env=env,
                              capture_output=True, text=True, timeout=60)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("lmprof: error: shell completion is for bash, zsh, fish and PowerShell; this one is sh")
        assert proc.stdout == ""


def test_dir_names_the_lazy_api() -> None:
    names = dir(lmprof)
    assert {"profile", "profile_training", "profile_inference", "load_run", "load_results", "summary",
            "integrations", "__version__"} <= set(names)
    assert all(hasattr(lmprof, n) for n in lmprof.__all__)
