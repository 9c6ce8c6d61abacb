"""The ``lmprof`` command on terminals that cannot show its characters and on pipes closed early.

Round 4 (issue 49, item 13): with stdout in ASCII or cp1252, ``compare`` died on the first em dash
and a passing ``--fail-on`` gate exited 1, which means "regression"; with the reader gone
(``| head -1``) a passing gate exited 1 too. The truth here is the exit code's documented meaning
(docs/ci-gate.md: 0 pass, 1 regression) and the bytes a pipe receives. The reader-gone case is made
certain, not raced: the pipe's read end is closed before the command starts.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.cli._streams import ERRORS, safe_stream
from sweep_fakes import _run

LMPROF = [sys.executable, "-m", "lmprof"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two runs alike and a third whose step takes longer (batch 4: 5 ms against 3 ms, sweep_fakes)."""
    base = tmp_path_factory.mktemp("runs")
    a, b, slow = base / "a", base / "b", base / "slow"
    _run("a", "train", "tiny", 2, 32).save(a)
    _run("b", "train", "tiny", 2, 32).save(b)
    _run("slow", "train", "tiny", 4, 32).save(slow)
    return a, b, slow


def _lmprof(args: list[object], env: dict[str, str], stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([*LMPROF, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, env=full, timeout=120)


def test_characters_an_encoding_lacks_are_written_as_ascii():
    assert "step \u2014 5 \u00d7 3 \u00b5s caf\u00e9 \u2192 ok".encode("ascii", ERRORS) == b"step - 5 x 3 us cafe -> ok"
    assert "\u2014".encode("cp1252", ERRORS) == "\u2014".encode("cp1252")  # cp1252 has the em dash: kept
    assert "\u4e2d".encode("ascii", ERRORS) == b"?"
    # a file name's byte that is not UTF-8 (a surrogate escape) is written back as that byte
    assert os.fsdecode(b"run\xff").encode("ascii", ERRORS) == b"run\xff"


def test_a_stream_whose_reader_is_gone_drops_what_follows():
    read, write = os.pipe()
    os.close(read)
    try:
        with open(write, "w", closefd=False) as plain:
            stream = safe_stream(plain)
            assert stream is not None
            stream.write("x" * 100_000)  # past any pipe buffer: the reader is gone
            stream.flush()
            null = os.stat(os.devnull)
            now = os.fstat(write)
            assert (now.st_rdev, now.st_ino) == (null.st_rdev, null.st_ino)  # the descriptor is /dev/null's
    finally:
        os.close(write)


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "cp1252"}, {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}],
                         ids=["cp1252", "C-locale"])
def test_compare_prints_on_a_narrow_encoding(runs, env):
    a, b, _ = runs
    done = _lmprof(["compare", a, b, "--no-trace"], env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr and b"figure" in done.stdout
    done.stdout.decode("cp1252")  # what the terminal's encoding can show, nothing else


def test_a_gate_keeps_its_exit_codes_with_the_reader_gone_on_an_ascii_terminal(runs):
    a, b, slow = runs
    read, write = os.pipe()
    os.close(read)
    try:
        env = {"PYTHONIOENCODING": "ascii"}
        passing = _lmprof(["compare", a, b, "--no-trace", "--fail-on", "step_time>+5%"], env, stdout=write)
        failing = _lmprof(["compare", a, slow, "--no-trace", "--fail-on", "step_time>+5%"], env, stdout=write)
    finally:
        os.close(write)
    assert passing.returncode == 0, passing.stderr.decode(errors="replace")
    assert b"Traceback" not in passing.stderr
    assert failing.returncode == 1, failing.stderr.decode(errors="replace")  # 1: the regression, as documented
    assert b"Traceback" not in failing.stderr
