"""Atomic file writes: a reader sees the old file or the whole new one, never a partial one.

Every file lmprof writes (run.json, CSVs, traces, caches, reports, plots) goes through here, so a
kill -9 or a full disk in the middle of a write never leaves a truncated record behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lmprof.errors import LmprofError

# Failures of the place, not of lmprof: a full disk, a read-only mount, no permission, a path the
# filesystem refuses. They become one line naming the file; anything else keeps its traceback.
WRITE_FAILURES = frozenset({
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO,
    errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR,
})


class WriteError(LmprofError, OSError):
    """A file could not be written (disk full, read-only, no permission); still an OSError for callers
    that catch those, and one line (``cannot write PATH: cause``) for the CLI."""

    def __init__(self, path: str | os.PathLike[str], cause: OSError):
        super().__init__(cause.errno, cause.strerror, str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        why = os.strerror(self.errno).lower() if self.errno else (self.strerror or "unknown error")
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            why += " (disk full: free some space or write elsewhere; nothing was left half-written)"
        return f"cannot write {self.path}: {why}"


def write_failure(path: str | os.PathLike[str], exc: OSError) -> OSError:
    """``exc`` as a :class:`WriteError` for ``path`` when it is a failure of the place, else unchanged."""
    if isinstance(exc, WriteError) or exc.errno not in WRITE_FAILURES:
        return exc
    return WriteError(path, exc)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    For libraries that insist on writing a file themselves (matplotlib, gzip, sqlite exports).
    The temporary file keeps ``path``'s suffix so format detection by extension still works.
    On error the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent)
    except OSError as exc:
        raise write_failure(target, exc) from exc
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file 0600; the result should have the permissions any new file gets here.
    os.chmod(tmp_path, 0o666 & ~_umask())
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        if isinstance(exc, OSError):
            raise write_failure(target, exc) from exc
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and return the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically and return the path."""
    return write_bytes(path, text.encode(encoding))
