"""What the generator scripts share: write a generated file when it changed, or say whether it is up to date."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def write_or_check(path: Path, text: str, check: bool, same: Callable[[str, str], bool] = str.__eq__,
                   then: str = "") -> int:
    """``--check``: print whether ``path`` holds ``text`` (by ``same``), 1 when not; else write it
    (atomically) when it differs, printing ``then`` after "wrote ...". Returns the exit code."""
    sys.path.insert(0, str(ROOT / "src"))  # lmprof of this checkout, installed or not
    from lmprof.atomic import write_text

    current = path.read_text() if path.exists() else None
    shown = path.relative_to(ROOT)
    ok = current is not None and same(current, text)
    if check:
        print(f"{shown}: {'up to date' if ok else 'out of date: run without --check'}")
        return 0 if ok else 1
    if current != text:
        write_text(path, text)
        print(f"wrote {shown}{then}")
    else:
        print(f"{shown} is up to date")
    return 0
