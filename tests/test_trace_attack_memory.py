"""Memory stays bounded on hostile traces and run folders (issue 29 item 2).

The hostile files cost almost nothing to make: sparse files (a 1 GiB hole is 4 KB on disk) and a
gzip whose members repeat one compressed block (1 GiB of one string in ~1 MB). Each command runs in
a child whose own child's peak RSS (RUSAGE_CHILDREN, so no earlier test's subprocess counts) is
reported back, under an address-space cap so that a regression fails instead of eating the machine.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from lmprof.trace.kineto.split import MAX_HELD_BYTES

GIB = 1 << 30
RSS_LIMIT_KB = 1_000_000  # "about 1 GB extra" at most; lmprof analyze's own baseline is ~200 MB
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sparse files, RLIMIT_AS and ru_maxrss in KB")

_PROBE = """
import resource, subprocess, sys
cap = 4 << 30  # a regression dies here (MemoryError, exit 1) instead of using 8 GB
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
r = subprocess.run(sys.argv[1:], capture_output=True, preexec_fn=limit)
sys.stderr.buffer.write(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)
"""


def _run_measured(*args: object) -> tuple[int, int, str]:
    """(exit code, peak RSS in KB, stderr) of ``python -m lmprof ARGS`` in a grandchild."""
    cmd = [sys.executable, "-c", _PROBE, sys.executable, "-m", "lmprof", *map(str, args)]
    env = {**os.environ, "LMPROF_NO_UPDATE_CHECK": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    rss, code = map(int, r.stdout.split()[-2:])
    return code, rss, r.stderr


def _one_line(code: int, err: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err


def _gzip_member(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def one_string_gz(path: Path, gib: int = 1) -> Path:
    """A .json.gz whose only event has a name ``gib`` GiB long, as concatenated gzip members."""
    block = _gzip_member(b"A" * (16 << 20))
    with path.open("wb") as f:
        f.write(_gzip_member(b'{"traceEvents":[{"ph":"X","name":"'))
        for _ in range(gib * 64):
            f.write(block)
        f.write(_gzip_member(b'","ts":1,"dur":1,"pid":1,"tid":1}]}'))
    return path


def sparse(path: Path, head: bytes, size: int = GIB, tail: bytes = b"") -> Path:
    with path.open("wb") as f:
        f.write(head)
    os.truncate(path, size)
    if tail:
        with path.open("ab") as f:
            f.write(tail)
    return path


def test_a_gzip_inflating_to_a_gib_of_one_string_is_refused_with_the_limit(tmp_path):
    p = one_string_gz(tmp_path / "bomb.json.gz")
    assert p.stat().st_size < 4 << 20
    code, rss, err = _run_measured("analyze", p)
    _one_line(code, err)
    assert f"more than {MAX_HELD_BYTES >> 20} MiB in one event" in err
    assert rss < RSS_LIMIT_KB, f"peak RSS {rss} KB"


@pytest.mark.parametrize("head, where", [
    (b'{"traceEvents":[', "in one event"),  # the splitter's buffer with no event boundary
    (b'{"displayTimeUnit": "', "before the traceEvents list"),
    (b'{"traceEvents":[{"ph":"i","name":"a","ts":1,"pid":1,"tid":1,"s":"t"}], "x": "', "after the traceEvents list"),
])
def test_a_sparse_gib_hole_is_refused_with_the_limit(tmp_path, head, where):
    p = sparse(tmp_path / "hole.json", head)
    code, rss, err = _run_measured("analyze", p)
    _one_line(code, err)
    assert where in err and f"{MAX_HELD_BYTES >> 20} MiB" in err
    assert rss < RSS_LIMIT_KB, f"peak RSS {rss} KB"


def test_an_ordinary_trace_is_still_read(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::mm{i % 7}", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1,
               "args": {"pad": "x" * 200}} for i in range(30_000)]  # ~9 MB: several reads and cuts
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode(), 1))
    from lmprof.trace.load import load_trace

    assert len(load_trace(p).events) == 30_000


@pytest.mark.parametrize("char", [b"[", b'"'])
def test_a_flood_of_brackets_or_quotes_stays_under_a_gib(tmp_path, char):
    """The worst case for the splitter's vectorised scan: every byte is one it tracks."""
    p = tmp_path / "flood.json.gz"
    block = _gzip_member(char * (1 << 20))
    with p.open("wb") as f:
        f.write(_gzip_member(b'{"traceEvents":[{"a":'))
        for _ in range(64):
            f.write(block)
    code, rss, err = _run_measured("analyze", p)
    _one_line(code, err)
    assert rss < RSS_LIMIT_KB, f"peak RSS {rss} KB"


# -- report.html: embedded images -----------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64  # the signature is all the embedder checks


def _run_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_compare import make_run

    run = make_run("r")
    run.files.update(files)
    folder = tmp_path / "run"
    run.save(folder)
    return folder


def test_a_gib_sparse_memory_png_is_skipped_with_a_note(tmp_path):
    folder = _run_folder(tmp_path, {"memory_timeline": "memory.png"})
    sparse(folder / "memory.png", PNG)
    code, rss, err = _run_measured("report", folder)
    assert code == 0, err
    html = (folder / "report.html").read_text()
    assert len(html) < 5 << 20
    assert "more than the 16 MiB a report embeds" in html
    assert rss < RSS_LIMIT_KB, f"peak RSS {rss} KB"


def test_one_png_under_many_names_is_embedded_once(tmp_path):
    from lmprof.show.run_report import render_run_report

    spellings = ["memory.png", "./memory.png", ".//memory.png", "./././memory.png", "link.png"]
    folder = _run_folder(tmp_path, {f"memory_{i}": name for i, name in enumerate(spellings)})
    (folder / "memory.png").write_bytes(PNG)
    (folder / "link.png").symlink_to("memory.png")
    (folder / "notpng.png").write_bytes(b"GIF89a")
    from lmprof.record.run import Run

    run = Run.load(folder)
    run.files["other"] = "notpng.png"
    html = render_run_report(run, folder)
    assert len(re.findall("data:image/png;base64,", html)) == 1 + ("Per-block time" in html)
    assert "notpng.png: not a PNG image, not shown" in html
