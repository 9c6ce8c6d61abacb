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
    from generated import write_or_check
    from lmprof.trace.kineto.schema import c_header

    return write_or_check(HEADER, c_header(), args.check, then="; now rebuild the reader: make setup")


if __name__ == "__main__":
    sys.exit(main())
