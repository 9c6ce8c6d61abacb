"""Write the compiled trace reader's key table, ``src/lmprof/trace/kineto/_keys.h``, from the event
schema (``src/lmprof/trace/kineto/schema.py``), then rebuild it with ``make setup``.

Usage::

    .venv/bin/python scripts/gen_scan_keys.py           # write the header
    .venv/bin/python scripts/gen_scan_keys.py --check   # exit 1 when the header is not what the schema gives
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "src" / "lmprof" / "trace" / "kineto" / "_keys.h"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only say whether the header is up to date")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))  # the schema of this checkout, installed or not
    from lmprof.atomic import write_text
    from lmprof.trace.kineto.schema import c_header

    text = c_header()
    current = HEADER.read_text() if HEADER.exists() else None
    if args.check:
        print(f"{HEADER.relative_to(ROOT)}: {'up to date' if current == text else 'out of date: run without --check'}")
        return 0 if current == text else 1
    if current != text:
        write_text(HEADER, text)
        print(f"wrote {HEADER.relative_to(ROOT)}; now rebuild the reader: make setup")
    else:
        print(f"{HEADER.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
