"""Check an output folder before anything is measured, so a finished measurement is never lost.

A run writes its record only at the end; an ``--out`` that names a file, a read-only folder or a
pseudo-filesystem would otherwise be discovered after minutes of timed steps. :func:`check_output_dir`
fails first, in one line.
"""
from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from lmprof.errors import ConfigError

# Kernel pseudo-filesystems: writable-looking, never a place for results.
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))


# Used when the filesystem does not say (os.pathconf fails): the limits of Linux and macOS filesystems.
NAME_MAX = 255
PATH_MAX = 4096


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Raise ConfigError unless ``path`` is (or can be created as) a writable folder; returns it.

    Nothing is created here: the first missing ancestor is where the folder would be made, so that
    ancestor's nearest existing parent must be a writable directory. Everything that would only fail
    after measuring is refused here too: bytes that are not UTF-8 (the record could not name the
    path), a name longer than the filesystem allows, a symbolic-link loop.
    """
    p = Path(path)
    _check_name(p, what)
    try:
        absolute = p.expanduser().absolute()
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"{what} {p}: {exc}") from None
    for pseudo in _PSEUDO:
        if absolute == pseudo or pseudo in absolute.parents:
            raise ConfigError(f"{what} {p} is under {pseudo}, a kernel pseudo-filesystem: choose a normal folder")
    _check_lengths(p, absolute, what)
    if _exists(p, what):
        _writable_folder(p, f"{what} {p}", ": choose a folder")
        return p
    parent = absolute.parent
    while not _exists(parent, what):
        parent = parent.parent
    _writable_folder(parent, f"{what} {p} cannot be created: {parent}", "")
    return p


def _check_name(p: Path, what: str) -> None:
    """Refuse a path that is not valid UTF-8: run.json, the store and the report must be able to name it."""
    text = str(p)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        raise ConfigError(f"{what} {shown} has bytes that are not UTF-8: lmprof records paths as text (JSON), "
                          "so rename it or choose another folder") from None


def _check_lengths(p: Path, absolute: Path, what: str) -> None:
    """Refuse a name or path longer than the filesystem it would be made on allows (with the limit)."""
    existing = next((a for a in (absolute, *absolute.parents) if os.path.isdir(a)), Path("/"))
    name_max = _pathconf(existing, "PC_NAME_MAX", NAME_MAX)
    for part in absolute.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise ConfigError(f"{what} {part[:24]}...: a name of {size} bytes, longer than this "
                              f"filesystem's limit of {name_max} bytes per name: choose a shorter one")
    path_max = _pathconf(existing, "PC_PATH_MAX", PATH_MAX)
    # The run folder and its files add up to about 120 bytes below --out.
    if len(os.fsencode(str(absolute))) + 120 > path_max:
        raise ConfigError(f"{what} {str(p)[:40]}... is {len(os.fsencode(str(absolute)))} bytes long; with the run folder "
                          f"inside it would pass this system's path limit of {path_max} bytes: choose a shorter path")


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value and value > 0 else default


def _writable_folder(folder: Path, subject: str, file_hint: str) -> None:
    """Raise ConfigError '<subject> is a file, not a folder<file_hint>' or '<subject> is not writable (why)'."""
    if not folder.is_dir():
        raise ConfigError(f"{subject} is a file, not a folder{file_hint}")
    problem = _cannot_write(folder)
    if problem:
        raise ConfigError(f"{subject} is not writable ({problem})")


def _exists(p: Path, what: str = "--out") -> bool:
    """Whether ``p`` exists; a symbolic-link loop is ConfigError (Path.exists() calls it missing)."""
    try:
        os.stat(p)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{what} {p}: too many levels of symbolic links (a symlink loop at {p}): "
                              "fix the links or choose another folder") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise ConfigError(f"{what} {p}: file name too long") from None
        if exc.errno == errno.ENOTDIR:
            return False  # a file on the way: the walk up finds it and says so
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
    _check_name(p, what)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a folder: give the name of a file to write")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{what} {p} is not a regular file")
    check_output_dir(p.parent if str(p.parent) else Path("."), what=f"{what} {p}: folder")
    return p


# Files lmprof reads inside a run or sweep folder: records, stores, traces, specs, configs. An output
# may sit beside them (report.html, a CSV) but never on them.
_INPUT_SUFFIXES = (".json", ".json.gz", ".gz", ".sqlite", ".sqlite-wal", ".sqlite-shm", ".db", ".yaml", ".yml")


def check_not_input(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None],
                    what: str = "--out") -> None:
    """Raise ConfigError when writing ``out`` would destroy one of ``inputs``.

    That is: ``out`` is an input (the same path, or the same file through a link), or it lies inside an
    input folder and is one of the files lmprof reads there (a record, store, trace, spec or config).
    """
    target = _resolved(Path(out))
    for given in inputs:
        if given is None:
            continue
        source = Path(given)
        if target == _resolved(source) or _same_file(Path(out), source):
            raise ConfigError(f"{what} {out} is the input {source}: writing it would destroy what it is made from; "
                              "choose another file")
        folder = _resolved(source)
        if folder.is_dir() and folder in target.parents and target.name.lower().endswith(_INPUT_SUFFIXES):
            raise ConfigError(f"{what} {out} would overwrite {target.name}, one of the files lmprof reads in "
                              f"{source}: choose another name")


def _resolved(p: Path) -> Path:
    try:
        return p.expanduser().resolve()
    except (OSError, RuntimeError):
        return p.expanduser().absolute()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False
