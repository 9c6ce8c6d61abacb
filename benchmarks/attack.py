"""Attack a real sweep the way issue 14 did, and count what it cost: points lost and points duplicated.

    PYTHONPATH=src .venv/bin/python benchmarks/attack.py [--kills 4] [--seed 0] [--repeats 2]

Two cases, each on a fresh sweep folder of tiny CPU points (train and infer, real worker processes):

* **kill and resume** — ``lmprof sweep`` is SIGKILLed at random moments, then resumed with
  ``--resume``, until the sweep finishes. A point seen ``ok`` once must stay ``ok`` with the same
  finish time and a readable run record (else it is *lost*), and must never run again (else it is
  *duplicated*).
* **two sweeps at once** — two ``lmprof sweep --resume`` on the same folder, the second started as
  soon as the first has planned its points. The second must stop at once with one line (the store's
  lock); every point must end ``ok`` having run exactly once.

Prints one line per case; both counts must be 0 (exit code 1 otherwise). Not a test: it takes a few
minutes and its timing depends on the machine.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
models:
  - {{name: mini, n_layer: 1, n_head: 2, n_embd: 32}}
batch_sizes: [1, 2]
seq_lens: [16]
modes: [train, infer]
devices: [cpu]
steps: 1
warmup: 0
profile_steps: 1
new_tokens: 2
energy: "off"
repeats: {repeats}
timeout_s: 300
"""


def _sweep(spec: Path, out: Path, resume: bool) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "lmprof", "sweep", str(spec), "--out", str(out)] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _rows(out: Path) -> dict[str, tuple[str, str | None, int]]:
    """Point id -> (status, finished, attempts), read as another process would."""
    db = out / "results.sqlite"
    if not db.is_file():
        return {}
    for _ in range(50):
        try:
            conn = sqlite3.connect(db, timeout=10)
            try:
                return {r[0]: (r[1], r[2], int(r[3]))
                        for r in conn.execute("SELECT id, status, finished, attempts FROM points")}
            finally:
                conn.close()
        except sqlite3.OperationalError:  # the store is being created right now
            time.sleep(0.1)
    return {}


def _record_ok(out: Path, point_id: str) -> bool:
    from lmprof.record.run import Run

    try:
        Run.load(out / "runs" / point_id)
        return True
    except Exception:  # noqa: BLE001 - an unreadable record is a lost point
        return False


def kill_and_resume(spec: Path, out: Path, kills: int, rng: random.Random) -> tuple[int, int, int, int]:
    """Returns (points, lost, duplicated, kills done)."""
    seen_ok: dict[str, str | None] = {}  # id -> finished time when first seen ok
    lost: set[str] = set()
    dup: set[str] = set()

    def observe() -> None:
        for pid, (status, finished, _) in _rows(out).items():
            if pid in seen_ok:
                if status != "ok" or not _record_ok(out, pid):
                    lost.add(pid)
                elif finished != seen_ok[pid]:
                    dup.add(pid)  # finished again: it ran a second time
            elif status == "ok":
                seen_ok[pid] = finished

    done_kills, resume = 0, False
    while True:
        proc = _sweep(spec, out, resume)
        resume = True
        if done_kills < kills:
            deadline = time.monotonic() + rng.uniform(3.0, 12.0)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
                observe()
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)  # the runner only: its worker notices and exits by itself
                proc.wait()
                done_kills += 1
                observe()
                continue
        while proc.poll() is None:
            time.sleep(0.5)
            observe()
        observe()
        rows = _rows(out)
        if all(s == "ok" for s, _, _ in rows.values()) and rows:
            break
        if proc.returncode not in (0, None) and done_kills >= kills:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"sweep failed: {err.strip()}")
    rows = _rows(out)
    lost |= {pid for pid, (s, _, _) in rows.items() if s != "ok" or not _record_ok(out, pid)}
    return len(rows), len(lost), len(dup), done_kills


def two_at_once(spec: Path, out: Path) -> tuple[int, int, int, str]:
    """Returns (points, lost, duplicated, the refused sweep's stderr line)."""
    a = _sweep(spec, out, resume=True)
    # The second starts once the first has planned its points: the moment the duplicates came from.
    deadline = time.monotonic() + 120
    while not _rows(out) and a.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    b = _sweep(spec, out, resume=True)
    a.wait()
    b.wait()
    errs = [p.stderr.read().decode(errors="replace").strip() if p.stderr else "" for p in (a, b)]
    codes = (a.returncode, b.returncode)
    refused = next((e for e, c in zip(errs, codes) if c == 2), "")
    if sorted(codes) != [0, 2]:
        print(f"  exit codes {codes}; stderr: {errs}")
    rows = _rows(out)
    lost = sum(1 for pid, (s, _, _) in rows.items() if s != "ok" or not _record_ok(out, pid))
    duplicated = sum(attempts - 1 for _, _, attempts in rows.values() if attempts > 1)
    return len(rows), lost, duplicated, refused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=4, help="SIGKILLs of the sweep before it may finish")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--repeats", type=int, default=2, help="repeats of each of the 4 configurations")
    ap.add_argument("--case", choices=("all", "kill", "twice"), default="all", help="which attack to run")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rng = random.Random(args.seed)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="lmprof-attack-") as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(SPEC.format(repeats=args.repeats))
        if args.case in ("all", "kill"):
            t0 = time.monotonic()
            n, lost, dup, kills = kill_and_resume(spec, Path(tmp) / "killed", args.kills, rng)
            print(f"kill -9 and resume: {n} points, {kills} SIGKILLs, points lost: {lost}, points duplicated: {dup} "
                  f"({time.monotonic() - t0:.0f} s)")
            bad += lost + dup
        if args.case in ("all", "twice"):
            t0 = time.monotonic()
            n, lost, dup, refused = two_at_once(spec, Path(tmp) / "twice")
            print(f"two sweeps at once: {n} points, points lost: {lost}, points duplicated: {dup} "
                  f"({time.monotonic() - t0:.0f} s); the second said: {refused or '(nothing: not refused!)'}")
            bad += lost + dup + (0 if refused else 1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
