"""Check an output folder before anything is measured, so a finished measurement is never lost.

A run writes its record only at the end; an ``--out`` that names a file, a read-only folder or a
pseudo-filesystem would otherwise be discovered after minutes of timed steps. :func:`check_output_dir`
fails first, in one line.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from lmprof.errors import ConfigError

# Kernel pseudo-filesystems: writable-looking, never a place for results.
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Raise ConfigError unless ``path`` is (or can be created as) a writable folder; returns it.

    Nothing is created here: the first missing ancestor is where the folder would be made, so that
    ancestor's nearest existing parent must be a writable directory.
    """
    p = Path(path)
    try:
        absolute = p.expanduser().absolute()
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"{what} {p}: {exc}") from None
    for pseudo in _PSEUDO:
        if absolute == pseudo or pseudo in absolute.parents:
            raise ConfigError(f"{what} {p} is under {pseudo}, a kernel pseudo-filesystem: choose a normal folder")
    if p.exists():
        _writable_folder(p, f"{what} {p}", ": choose a folder")
        return p
    parent = absolute.parent
    while not _exists(parent):
        parent = parent.parent
    _writable_folder(parent, f"{what} {p} cannot be created: {parent}", "")
    return p


def _writable_folder(folder: Path, subject: str, file_hint: str) -> None:
    """Raise ConfigError '<subject> is a file, not a folder<file_hint>' or '<subject> is not writable (why)'."""
    if not folder.is_dir():
        raise ConfigError(f"{subject} is a file, not a folder{file_hint}")
    problem = _cannot_write(folder)
    if problem:
        raise ConfigError(f"{subject} is not writable ({problem})")


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:
        return True  # there but not ours to look into: the write probe below says why


def _cannot_write(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder`` (None when it can): a real probe, not permission bits,
    so read-only mounts and root's privileges are judged as the write will be."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def check_output_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Raise ConfigError unless a file can be written at ``path`` (not a folder; its folder writable)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a folder: give the name of a file to write")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{what} {p} is not a regular file")
    check_output_dir(p.parent if str(p.parent) else Path("."), what=f"{what} {p}: folder")
    return p
