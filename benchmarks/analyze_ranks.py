"""Memory and time of ``lmprof analyze`` on folders of many rank traces (issue 46, "hundreds of ranks").

Writes N rank traces (copies of the real 2-rank trace in tests/data/traces, whole, each pair's
clock shifted and its distributedInfo rank renumbered) for each N, then analyses each folder in a
fresh child process (``lmprof.trace.analyze.analyze_path``) in this process's way (``--workers 1``)
and in worker processes (``--workers K``), and prints per run:

* the driver's peak resident memory (``VmHWM`` of the child, Linux KiB; not ``ru_maxrss``, which Linux
  carries across exec from this process): the claim is that it
  does not grow with N beyond the reports it keeps (kilobytes per rank), since no trace is ever
  loaded in the driver when workers run;
* the largest worker's peak (``RUSAGE_CHILDREN`` of the driver): one trace at a time;
* wall seconds, and the ratio of the serial run over the worker run of the same N (both measured
  in this run, alternating), which only means something on a quiet machine.

Usage::

    .venv/bin/python benchmarks/analyze_ranks.py                 # N = 16, 64, 256; K = 4
    .venv/bin/python benchmarks/analyze_ranks.py --ranks 8 32 --workers 2
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from lmprof.trace.fanout import analyze_path

    if __name__ == "__main__":
        t0 = time.perf_counter()
        report = analyze_path(sys.argv[1], workers=int(sys.argv[2]))
        wall = time.perf_counter() - t0
        print(json.dumps({"wall_s": wall, "traces": len(report.traces),
                          "driver_kib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]),
                          "worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


def make_folder(root: Path, n: int) -> Path:
    out = root / f"ranks{n}"
    out.mkdir()
    pair = [json.loads(gzip.decompress((TRACES / f"gpu_2rank_rank{r}.json.gz").read_bytes())) for r in (0, 1)]
    for k in range((n + 1) // 2):
        for r, doc in enumerate(pair):
            rank = 2 * k + r
            if rank >= n:
                break
            events = [dict(e, ts=e["ts"] + 1_000 * k) if "ts" in e else e for e in doc["traceEvents"]]
            copy = dict(doc, traceEvents=events, distributedInfo=dict(doc["distributedInfo"], rank=rank))
            (out / f"rank{rank:05d}.json").write_text(json.dumps(copy))  # a benchmark's scratch file
    return out


def run(script: Path, folder: Path, workers: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(script), str(folder), str(workers)], capture_output=True, text=True,
                          check=True, timeout=3600)
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmprof-ranks-") as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)  # a benchmark's scratch file
        print(f"{'ranks':>6} {'workers':>7} {'wall s':>8} {'driver MiB':>11} {'worker MiB':>11} {'serial/workers':>15}")
        for n in a.ranks:
            folder = make_folder(Path(tmp), n)
            serial = run(script, folder, 1)
            fan = run(script, folder, a.workers)
            assert serial["traces"] == fan["traces"] == n
            for k, r in ((1, serial), (a.workers, fan)):
                ratio = f"{serial['wall_s'] / fan['wall_s']:.2f}x" if k != 1 else ""
                print(f"{n:>6} {k:>7} {r['wall_s']:>8.2f} {r['driver_kib'] / 1024:>11.1f} "
                      f"{r['worker_kib'] / 1024:>11.1f} {ratio:>15}")


if __name__ == "__main__":
    main()
