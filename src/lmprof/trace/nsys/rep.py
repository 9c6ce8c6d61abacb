"""A ``.nsys-rep`` report is read through Nsight Systems' own exporter, when it is installed.

``nsys export --type sqlite`` writes the SQLite file lmprof reads (:mod:`lmprof.trace.nsys.build`)
into a private temporary folder, removed afterwards. Without ``nsys`` on PATH the report cannot be
read (its format is NVIDIA's own): one line says how to export it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from lmprof.errors import DataError

EXPORT_TIMEOUT_S = 3600.0  # a report of several GB exports in minutes; a hung exporter is stopped


def how_to_export(path: Path) -> str:
    return f"nsys export --type sqlite --output report.sqlite {path}"


@contextlib.contextmanager
def exported(path: Path) -> Iterator[Path]:
    """The SQLite export of the report at ``path``, in a temporary folder removed on exit."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise DataError(f"{path} is an Nsight Systems report and nsys is not on PATH: export it with "
                        f"`{how_to_export(path)}` and analyse report.sqlite")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    with tempfile.TemporaryDirectory(prefix="lmprof-nsys-") as tmp:
        out = Path(tmp) / "report.sqlite"
        cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(out),
               os.path.abspath(path)]
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=EXPORT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DataError(f"{path}: `nsys export` failed ({exc}); export it yourself: {how_to_export(path)}") from None
        if done.returncode != 0 or not out.is_file():
            lines = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
            why = lines[-1][:200] if lines else f"exit status {done.returncode}"
            raise DataError(f"{path}: `nsys export` failed ({why})")
        yield out
