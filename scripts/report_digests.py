"""The md5 of ``lmprof analyze TRACE --json`` for every real trace: a change to the reader or an
analysis must leave these unchanged unless it means to change the report.

Each trace is analysed by the console command in a fresh process (the path users take), with the
given extra options (``--opts "--device a100"`` adds a second variant); the traces are every
``*.json.gz`` in ``tests/data/traces``, ``../shared/traces`` (beside the worktree) and
``benchmarks/data``, plus any paths given (e.g. the large benchmark traces kept with
``benchmarks/analyze_speed.py --keep``).

Usage::

    .venv/bin/python scripts/report_digests.py > /tmp/digests.before
    ... change something ...
    .venv/bin/python scripts/report_digests.py | diff /tmp/digests.before -
    .venv/bin/python scripts/report_digests.py --opts "" --opts "--device a100 --top 30" /tmp/big.json
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "tests" / "data" / "traces", ROOT.parent / "shared" / "traces", ROOT / "benchmarks" / "data")


def traces(extra: list[Path]) -> list[Path]:
    """Every trace of the folders above (sorted by folder, then name), then ``extra``."""
    found = [p for d in FOLDERS if d.is_dir() for p in sorted(d.glob("*.json.gz"))]
    return found + extra


def _shown(path: Path) -> str:
    """The path as seen from the worktree (``../shared/...`` for the shared folder)."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    if path.is_relative_to(ROOT.parent):
        return "../" + str(path.relative_to(ROOT.parent))
    return str(path)


def digest(path: Path, opts: list[str]) -> str:
    """md5 of the command's stdout, or the exit code and last line of stderr when it failed."""
    cmd = [sys.executable, "-m", "lmprof", "analyze", str(path), "--json", *opts]
    out = subprocess.run(cmd, capture_output=True, check=False)
    if out.returncode != 0:
        last = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"exit {out.returncode}: {last[0][:120]}"
    return hashlib.md5(out.stdout).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path, help="more traces (e.g. the benchmark's large ones)")
    ap.add_argument("--opts", action="append", default=None,
                    help='extra options for one variant, e.g. "--device a100" (repeat for more; default: none)')
    args = ap.parse_args()
    variants = args.opts if args.opts is not None else [""]
    for path in traces(args.paths):
        for opts in variants:
            shown = _shown(path)
            label = f"{shown} {opts}".strip()
            print(f"{digest(path, opts.split())}  {label}", flush=True)


if __name__ == "__main__":
    main()
