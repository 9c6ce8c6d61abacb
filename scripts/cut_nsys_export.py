"""Cut an Nsight Systems SQLite export down to a time window, keeping its real rows unchanged.

    python scripts/cut_nsys_export.py SRC.sqlite DST.sqlite --span-ms 150 [--from-ms 0]

Rows of the event tables (kernels, copies, sets, runtime calls, synchronisations, NVTX events)
whose start lies in [first start + from, first start + from + span] are kept as they are, with
every table's schema; NVTX's domain and category definitions (no start time of their own that
matters) are kept whole, and so are the small description tables (processes, threads, streams,
devices, enums, metadata). StringIds keeps the ids the kept rows refer to. Other tables are emptied.
The result is a valid export of a shorter capture: lmprof's tests read it (tests/data/nsys/).
"""
from __future__ import annotations

import argparse
import os
import sqlite3
from pathlib import Path

EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")
KEEP_WHOLE_PREFIXES = ("ENUM_", "META_DATA_", "TARGET_INFO_", "PROCESSES", "ThreadNames", "ANALYSIS_")
STRING_COLUMNS = {"CUPTI_ACTIVITY_KIND_KERNEL": ("demangledName", "shortName", "mangledName"),
                  "CUPTI_ACTIVITY_KIND_RUNTIME": ("nameId",), "NVTX_EVENTS": ("textId",),
                  "ThreadNames": ("nameId",)}
NVTX_DEFINITIONS = (33, 75)  # category and domain names: kept whatever their time


def cut(src: Path, dst: Path, from_ms: float, span_ms: float) -> None:
    """Write the cut beside ``dst`` and rename it into place (a failed cut leaves nothing)."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    if tmp.exists():
        tmp.unlink()
    try:
        _cut(src, tmp, from_ms, span_ms)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def _cut(src: Path, dst: Path, from_ms: float, span_ms: float) -> None:
    out = sqlite3.connect(dst)
    out.execute("ATTACH DATABASE ? AS src", (f"file:{os.path.abspath(src)}?mode=ro",))
    tables = [r[0] for r in out.execute("SELECT name FROM src.sqlite_master WHERE type = 'table'")]
    for (sql,) in out.execute("SELECT sql FROM src.sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall():
        out.execute(sql)
    t0 = min(out.execute(f'SELECT min(start) FROM src."{t}"').fetchone()[0] or 2**62
             for t in EVENT_TABLES if t in tables)
    lo, hi = t0 + int(from_ms * 1e6), t0 + int((from_ms + span_ms) * 1e6)
    for t in tables:
        if t in EVENT_TABLES:
            extra = f" OR eventType IN {NVTX_DEFINITIONS}" if t == "NVTX_EVENTS" else ""
            out.execute(f'INSERT INTO main."{t}" SELECT * FROM src."{t}" WHERE (start BETWEEN ? AND ?){extra}', (lo, hi))
        elif t.startswith(KEEP_WHOLE_PREFIXES):
            out.execute(f'INSERT INTO main."{t}" SELECT * FROM src."{t}"')
    wanted = set()
    for t, cols in STRING_COLUMNS.items():
        if t in tables:
            have = {r[1] for r in out.execute(f'PRAGMA main.table_info("{t}")')}
            for c in cols:
                if c in have:
                    wanted.update(r[0] for r in out.execute(f'SELECT DISTINCT "{c}" FROM main."{t}"') if r[0] is not None)
    rows = out.execute("SELECT id, value FROM src.StringIds").fetchall()
    out.executemany("INSERT INTO main.StringIds VALUES (?, ?)", [r for r in rows if r[0] in wanted])
    out.commit()
    out.execute("DETACH DATABASE src")
    out.execute("VACUUM")
    out.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--from-ms", type=float, default=0.0)
    ap.add_argument("--span-ms", type=float, required=True)
    a = ap.parse_args()
    cut(a.src, a.dst, a.from_ms, a.span_ms)
    print(f"{a.dst}: {a.dst.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
