"""Start-up of ``lmprof analyze PATH --json``: no pandas, no typer, and the same output as typer's path.

pandas (~0.3 s) and typer with pydantic and rich (~0.15 s) cost more to import than analysing a
small trace; these tests keep them out of the command, and check that the typer-free path prints
what the typer command prints.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.cli._fast import fast_analyze_args

TRACES = Path(__file__).parent / "data" / "traces"
TINY = TRACES / "cpu_only_tiny.json.gz"
GPU = TRACES / "v100_train_rank0.json.gz"


def _modules_after(code: str) -> set[str]:
    """Top-level module names loaded after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_importing_the_analysis_loads_no_pandas() -> None:
    loaded = _modules_after("import lmprof.trace.analyze")
    assert "numpy" in loaded  # the probe works
    assert not loaded & {"pandas", "pyarrow", "torch"}


def test_analyze_json_command_loads_no_pandas_nor_typer() -> None:
    # stdout stays the real one (a pipe): typer's path is taken for a stream it would wrap
    code = f"from lmprof.cli.main import main\nassert main(['analyze', {str(GPU)!r}, '--json', '--top', '3']) == 0"
    loaded = _modules_after(code)
    assert "lmprof" in loaded and "orjson" in loaded
    assert not loaded & {"pandas", "pyarrow", "typer", "click", "pydantic", "rich", "torch"}


@pytest.mark.parametrize("trace", [TINY, GPU])
def test_fast_path_prints_what_the_typer_command_prints(cli, trace: Path) -> None:
    fast = cli("analyze", trace, "--json", "--top", "4")
    typed = cli("analyze", trace, "--json", "--top=4")  # '=' is typer's to parse
    assert fast_analyze_args(["analyze", str(trace), "--json", "--top", "4"]) is not None
    assert fast_analyze_args(["analyze", str(trace), "--json", "--top=4"]) is None
    assert fast == typed and fast[0] == 0
    assert json.loads(fast[1])["traces"][0]["operators"]["top"]  # a real report, not an empty line


def test_fast_path_reports_errors_as_the_typer_command_does(cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    fast = cli("analyze", missing, "--json")
    typed = cli("analyze", "--json", missing, "--include-last-step", "--top=10")
    assert fast == typed
    assert fast[0] == 2 and fast[2] == f"lmprof: error: not found: {missing}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "t.json"],  # tables (rich), not JSON
        ["analyze", "t.json", "--json", "--help"],
        ["analyze", "t.json", "--json", "--top", "0"],
        ["analyze", "t.json", "--json", "--top", "-3"],
        ["analyze", "t.json", "--json", "--top", "١"],  # a digit, but not one typer reads
        ["analyze", "t.json", "--json", "--top"],
        ["analyze", "t.json", "--json", "--device", "--json"],
        ["analyze", "t.json", "u.json", "--json"],
        ["analyze", "t.json", "--json", "--export", "out"],
        ["analyze", "t.json", "--json", "--"],
        ["analyze", "", "--json"],
        ["--help"],
        ["run", "t.json", "--json"],
    ],
)
def test_typer_parses_every_other_command_line(args: list[str]) -> None:
    assert fast_analyze_args(args) is None


def test_fast_path_arguments() -> None:
    got = fast_analyze_args(["analyze", "--include-last-step", "t.json", "--device", "a100", "--json", "--top", "007"])
    assert got == {"include_last_step": True, "device": "a100", "json_out": True, "top": 7, "path": Path("t.json")}


@pytest.mark.parametrize("extra", [[], ["--top", "3", "--export", "ops.parquet"]])
def test_a_trace_named_in_bytes_that_are_not_utf8_is_analysed(tmp_path: Path, extra: list[str]) -> None:
    """Found by attack: the name came back in the JSON as a str with surrogate escapes and orjson
    refused it (a traceback). Both paths (the typer-free one, and typer's when --export is given)."""
    import os
    import shutil

    src = next(TRACES.glob("*.json.gz"))
    name = os.fsdecode(b"bad\xff.json.gz")
    shutil.copy(src, tmp_path / name)
    args = [sys.executable, "-m", "lmprof", "analyze", name, "--json", *extra]
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["traces"][0]["path"].endswith("bad\ufffd.json.gz")


def test_json_text_shows_bytes_that_are_not_utf8_as_replacement_characters() -> None:
    import os

    from lmprof.printable import json_text

    name = os.fsdecode(b"a\xffb")
    assert json.loads(json_text({name: [name, 1.5, None]})) == {"a\ufffdb": ["a\ufffdb", 1.5, None]}


@pytest.mark.parametrize("preset", [None, "3"])
def test_analyze_keeps_numpys_blas_to_one_thread_unless_told(preset: str | None) -> None:
    """numpy's OpenBLAS worker spins ~0.1 s of CPU after numpy is imported (analyze never calls BLAS):
    the command asks for one thread, and a user's own OPENBLAS_NUM_THREADS is kept."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    code = ("import os, sys\nfrom lmprof.cli.main import main\n"
            f"assert main(['analyze', {str(TINY)!r}, '--json']) == 0\n"
            "print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert f"BLAS {preset or '1'}" in out.stderr.splitlines()


def test_the_heap_is_tuned_only_in_lmprofs_own_analyze_process() -> None:
    """The console command puts every thread on one glibc heap arena, where the analyses reuse what
    the decoding threads freed, and then the loader keeps that memory (no malloc_trim); a caller's
    process (``main(argv)``, a library call) keeps glibc's defaults. Both give the same table."""
    import platform

    code = ("import sys\nfrom lmprof.trace.kineto import heap, load\n"
            "plain = load.load_trace(sys.argv[1], workers=2)\n"
            "assert not heap._one_arena\n"
            "heap.tune_for_analyze()\n"
            "tuned = load.load_trace(sys.argv[1], workers=2)\n"
            "same = all((plain.event_cols[c] == tuned.event_cols[c]).all() for c in plain.event_cols)\n"
            "print('ARENA', heap._one_arena, same)")
    out = subprocess.run([sys.executable, "-c", code, str(GPU)], capture_output=True, text=True, check=True)
    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert f"ARENA {glibc} True" in out.stdout
