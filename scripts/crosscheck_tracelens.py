"""`lmprof analyze` against TraceLens' own reports of TraceLens' test traces: the device timeline.

    python scripts/crosscheck_tracelens.py GIT_DIR [--out DIR]

GIT_DIR is a clone (or the bare snapshot `fetch github:AMD-AGI/TraceLens` brings) of
https://github.com/AMD-AGI/TraceLens. Its tests hold real traces with the reports TraceLens makes of them
(`<trace>_perf_report_csvs/gpu_timeline.csv`, `perf_csvs/gpu_timeline.csv`: total, busy, idle, computation
and copy times in ms). For each trace with such a report, this runs `lmprof analyze --json` and prints both
side by side, marking a difference beyond 10 ns. Traces stored empty (Git LFS), or absent from a snapshot,
are skipped.

What to expect (docs/trace-analysis.md, "Device figures"): the window (TraceLens' total_time), busy and idle
equal; the computation/copy split differs by memsets, which TraceLens counts as computation on CUDA traces
and lmprof as memory, and TraceLens leaves some ROCm copies and memsets out of busy time altogether.
Not a test: it needs the other project's files, which this repository does not carry.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

FIELDS = {  # TraceLens' row -> lmprof's device.temporal field (us)
    "total_time": "span_us", "busy_time": "busy_us", "idle_time": "idle_us", "computation_time": "compute_us",
    "total_memcpy_time": "memory_us", "exposed_comm_time": "communication_us",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _pairs(repo: Path) -> list[tuple[str, str]]:
    """(trace, its gpu_timeline.csv) for every report whose trace can be told."""
    files = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
    known = set(files)
    pairs = []
    for ref in (f for f in files if f.endswith("/gpu_timeline.csv")):
        folder = ref.rsplit("/", 1)[0]
        if folder.endswith("_perf_report_csvs"):
            base = folder[: -len("_perf_report_csvs")]
            found = [c for c in (base + ".json.gz", base + ".json") if c in known]
        elif folder.endswith("/perf_csvs"):
            parent = folder.rsplit("/", 1)[0]
            found = [f for f in files if f.rsplit("/", 1)[0] == parent and f.endswith((".json.gz", ".json"))
                     and "execution_details" not in f]
        else:
            found = []
        if len(found) == 1:
            pairs.append((found[0], ref))
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", type=Path, help="TraceLens' git directory (a clone, or a bare snapshot)")
    ap.add_argument("--out", type=Path, default=None, help="where to keep the traces (default: a temporary folder)")
    args = ap.parse_args()
    if subprocess.run(["git", "-C", str(args.repo), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        print(f"crosscheck_tracelens: {args.repo} is not a git directory of TraceLens", file=sys.stderr)
        return 2
    lmprof = Path(sys.executable).with_name("lmprof")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        differ = 0
        for trace, ref in _pairs(args.repo):
            local = out / trace.replace("/", "__")
            if not local.exists():
                blob = subprocess.run(["git", "-C", str(args.repo), "show", f"HEAD:{trace}"], capture_output=True)
                if blob.returncode != 0:  # a snapshot may list its largest files without holding them
                    print(f"{trace}: not in this copy of the repository, skipped")
                    continue
                local.write_bytes(blob.stdout)
            if local.stat().st_size == 0:
                print(f"{trace}: stored empty (Git LFS), skipped")
                continue
            done = subprocess.run([str(lmprof), "analyze", str(local), "--json"], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{trace}: lmprof analyze failed: {done.stderr.strip()[:200]}")
                differ += 1
                continue
            report = json.loads(done.stdout)["traces"][0]
            temporal = (report.get("device") or {}).get("temporal")
            rows = {r["type"]: float(r["time ms"]) for r in csv.DictReader(io.StringIO(_git(args.repo, "show", f"HEAD:{ref}")))}
            rule = (report.get("device") or {}).get("window", {}).get("rule")
            print(f"{trace}  (lmprof window rule: {rule})")
            for row, field in FIELDS.items():
                if row not in rows:
                    continue
                mine = None if temporal is None else temporal[field] / 1e3
                mark = "" if mine is not None and abs(mine - rows[row]) <= 1e-5 else "   <- differs"
                differ += bool(mark)
                shown = "n/a" if mine is None else f"{mine:.6f}"
                print(f"    {row:18s} TraceLens {rows[row]:14.6f} ms   lmprof {shown:>14s} ms{mark}")
        print(f"{differ} figures differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
