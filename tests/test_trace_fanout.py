"""A folder of many rank traces: the same report in this process, in worker processes and on Ray,
with the driver's memory bounded (each rank reduced to its report and Parquet partition, then freed)."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lazy_imports import installed
from lmprof.trace.fanout import analyze_path
from lmprof.trace.fanout import PARALLEL_MIN_BYTES, analyze_files, pool_size

TRACES = Path(__file__).parent / "data" / "traces"
RANKS = 64
_WINDOW_US = 20_000  # of each real trace, the first 20 ms of its first step: ~260 events, real rows


@pytest.fixture(scope="module")
def rank_folder(tmp_path_factory) -> Path:
    """64 rank traces: copies of the real 2-rank trace, cut to a window, each pair's clock shifted."""
    out = tmp_path_factory.mktemp("ranks")
    pair = [json.loads(gzip.decompress((TRACES / f"gpu_2rank_rank{r}.json.gz").read_bytes())) for r in (0, 1)]
    start = min(e["ts"] for e in pair[0]["traceEvents"] if e.get("name", "").startswith("ProfilerStep"))
    for k in range(RANKS // 2):
        for r, doc in enumerate(pair):
            events = [dict(e, ts=e["ts"] + 1_000 * k) if "ts" in e else e for e in doc["traceEvents"]
                      if e.get("ph") != "X" or start <= e["ts"] < start + _WINDOW_US]
            cut = dict(doc, traceEvents=events, distributedInfo=dict(doc["distributedInfo"], rank=2 * k + r))
            (out / f"rank{2 * k + r:02d}.json").write_text(json.dumps(cut))
    return out


def _report(folder: Path, **kw) -> str:
    return json.dumps(analyze_path(folder, **kw).to_dict(), sort_keys=True)


_DRIVER = textwrap.dedent("""
    import json, sys
    from lmprof.trace.fanout import analyze_path

    if __name__ == "__main__":  # the workers' fork server imports this file again
        report = analyze_path(sys.argv[1], workers=2)
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a driver started by a pytest
        # worker that had grown to 1.9 GB read 1.9 GB; the high-water mark belongs to this process's memory
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        peak = int(status.split()[0]) * 1024  # kB
        print(json.dumps({"report": json.dumps(report.to_dict(), sort_keys=True), "peak_rss": peak}))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/status and the fork server: Linux")
def test_processes_give_the_serial_report_with_the_drivers_memory_bounded(rank_folder, tmp_path):
    serial = _report(rank_folder, workers=1)
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    done = subprocess.run([sys.executable, str(script), str(rank_folder)], capture_output=True, text=True,
                          timeout=300, check=True)
    got = json.loads(done.stdout)
    assert got["report"] == serial
    report = json.loads(serial)
    assert [r["rank"] for r in report["ranks"]["ranks"]] == list(range(RANKS))
    assert report["collectives"] is not None and report["cross_rank"] is not None
    assert got["peak_rss"] < 1 << 30  # the driver held reports, never a loaded trace


def test_partitions_from_workers_make_the_serial_parquet_files(rank_folder, tmp_path):
    pytest.importorskip("pyarrow")
    import pandas as pd

    folder = tmp_path / "four"
    folder.mkdir()
    for f in sorted(rank_folder.iterdir())[:4]:
        (folder / f.name).write_bytes(f.read_bytes())
    assert _report(folder, workers=1, export=tmp_path / "serial") == _report(folder, workers=2, export=tmp_path / "procs")
    for name in ("events", "kernels", "collectives", "critical_path"):
        a, b = (pd.read_parquet(tmp_path / d / f"{name}.parquet") for d in ("serial", "procs"))
        assert len(a) and a.equals(b), name
    assert sorted(set(pd.read_parquet(tmp_path / "procs" / "kernels.parquet")["rank"])) == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.skipif(not installed("ray"), reason="ray is not installed")
def test_ray_gives_the_serial_report(rank_folder):
    import signal

    files = sorted(rank_folder.iterdir())
    serial = _report(rank_folder, workers=1)
    from lmprof.trace.analyze import combine

    def mine(signum, frame):  # noqa: ANN001 - a caller's own SIGTERM handler
        raise SystemExit(143)

    before = signal.signal(signal.SIGTERM, mine)
    try:
        reports = analyze_files(files, ray="local",
                                ray_init={"num_cpus": 2, "num_gpus": 0, "object_store_memory": 80 * 1024 * 1024})
        # ray.init put its own handler in and left it: the caller's was gone for the rest of the process
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
    assert json.dumps(combine(reports).to_dict(), sort_keys=True) == serial
    import ray

    assert not ray.is_initialized()  # the Ray it started is shut down


def test_pool_size_follows_the_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("LMPROF_ANALYZE_WORKERS", raising=False)
    small = [tmp_path / f"{i}.json" for i in range(3)]
    for f in small:
        f.write_text("{}")
    assert pool_size(small) == 1  # starting workers would cost more than it saves
    assert pool_size(small, workers=8) == 3 and pool_size(small[:1], workers=4) == 1
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(PARALLEL_MIN_BYTES)
    assert pool_size([*small, big]) >= 1
    monkeypatch.setenv("LMPROF_ANALYZE_WORKERS", "2")
    assert pool_size(small) == 2


def test_a_bad_rank_fails_in_one_line_from_a_worker(rank_folder, tmp_path, capsys):
    from lmprof.cli.main import main

    folder = tmp_path / "bad"
    folder.mkdir()
    for f in sorted(rank_folder.iterdir())[:3]:
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "rank99.json").write_text('{"traceEvents": [')
    assert main(["analyze", str(folder), "--workers", "2", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmprof: error: ") and "rank99.json" in err and err.count("\n") == 1


def test_ray_missing_is_one_line(rank_folder, monkeypatch, capsys):
    from lmprof.cli.main import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["analyze", str(rank_folder), "--ray", "--json"]) == 2
    err = capsys.readouterr().err
    assert "needs Ray" in err and err.count("\n") == 1
