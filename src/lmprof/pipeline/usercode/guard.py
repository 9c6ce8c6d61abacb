"""lmprof never raises into the user's code: bad settings fail before the script starts, later
failures become one line on stderr.

* :func:`check_out` runs before the script (``lmprof run``) or the ``with`` block (``lmprof.profile``):
  a file, an unwritable place, a symlink loop or a name that is not UTF-8 is a ConfigError (exit 2),
  and the folder is made absolute so a script that ``os.chdir()``-s still writes where it was asked.
* :func:`guarded` wraps every entry point lmprof's hooks call inside the user's step: an exception
  there ends the session (hooks removed, profiler stopped, what was already written kept) and prints
  one line; the user's step goes on as if lmprof were not there.
* :func:`safe_name` keeps labels and names taken from the user's code (script names, class names)
  inside the output folder as one plain path component.
"""
from __future__ import annotations

import errno
import functools
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, TypeVar

from lmprof.errors import ConfigError
from lmprof.outdir import check_output_dir
from lmprof.printable import printable

F = TypeVar("F", bound=Callable[..., Any])

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_NAME = 60  # a run folder's name also holds a time stamp, the mode and the device: stay far below 255 bytes


def safe_name(name: str, fallback: str = "script") -> str:
    """``name`` as one harmless path component: ASCII letters, digits and ``._+-``, no leading dot,
    at most MAX_NAME characters (``../../x`` -> ``x``, ``a/b`` -> ``a_b``)."""
    clean = _UNSAFE.sub("_", name).strip("._")
    return clean[:MAX_NAME].rstrip("._") or fallback


def check_out(out: str | os.PathLike[str], what: str = "--out") -> Path:
    """The absolute output folder, checked before anything runs; ConfigError (one line) when a run
    folder could not be created there."""
    text = os.fspath(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {printable(text)!r} is not valid UTF-8: choose a folder name in UTF-8") from None
    path = Path(text).expanduser()
    try:
        path.resolve(strict=False)
        absolute = path.absolute()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python < 3.13
        raise ConfigError(f"{what} {text}: {why(exc)}") from None
    for parent in (absolute, *absolute.parents):
        if parent.is_symlink() and not parent.exists():
            try:
                os.stat(parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ConfigError(f"{what} {text}: {parent} is a symlink loop") from None
            raise ConfigError(f"{what} {text}: {parent} is a dangling symlink") from None
    check_output_dir(absolute, what)
    return absolute


def why(exc: BaseException) -> str:
    """A failure in a few words: 'disk full', 'permission denied', else its type and message."""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk full"
        if exc.strerror:
            where = f": {exc.filename}" if exc.filename else ""
            return f"{exc.strerror.lower()}{where}"
    if isinstance(exc, RecursionError):
        return "symlink loop"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def failure_line(exc: BaseException, writing: bool, continues: bool) -> str:
    """The one line printed when lmprof fails inside the user's program."""
    what = "could not write the report" if writing else "stopped measuring"
    tail = "; your script continues" if continues else ""
    return f"lmprof: {what} ({why(exc)}){tail}"


def guarded(fn: F) -> F:
    """Run a session method so that nothing it raises reaches the caller (the user's step).

    On an exception the session's ``fail`` ends it. In a forked child nothing runs: the session
    belongs to the process that started it. ``BaseException``-s that are not errors
    (KeyboardInterrupt, SystemExit, lmprof's own StopScript) go through untouched.
    """

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_guarded(self, fn, self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def run_guarded(session: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` for ``session`` as :func:`guarded` does (for hooks that are not the session's own
    methods, such as the optimizer-step trigger's)."""
    if getattr(session, "failed", False) or getattr(session, "pid", os.getpid()) != os.getpid():
        return None  # failed already, or a forked child: the session is its parent's
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        if getattr(getattr(session, "spec", None), "driven", False):
            session.abandon()  # lmprof's own loop: nothing of the user's to protect, the error goes on
            raise
        if os.environ.get("LMPROF_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        session.fail(exc)
        return None


# Checks of what the user gave, made before the script starts (and before torch is imported, so a
# refusal is one line in a fraction of a second).
def check_counts(warmup: int | None, steps: int | None, profile_steps: int | None, *, flags: bool) -> None:
    """Refuse counts the protocol cannot run, in one line naming the option (``--steps`` on the
    command line, ``steps`` in the Python API). ``steps`` may be 0: no clean window, times from the
    profiled steps (marked rough)."""
    from lmprof.errors import ConfigError

    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if flags else option

    if steps is not None and steps < 0:
        raise ConfigError(f"{name('steps')} must be >= 0, got {steps}")
    if profile_steps is not None and profile_steps <= 0:
        raise ConfigError(f"{name('profile_steps')} must be positive, got {profile_steps}")
    if warmup is not None and warmup < 0:
        raise ConfigError(f"{name('warmup')} must be >= 0, got {warmup}")


def check_target(target: str, module: bool) -> None:
    """ConfigError (one line, exit 2) unless ``target`` runs as ``python target`` / ``python -m target``
    would: a file, a folder or zip with ``__main__.py``, or an importable module."""
    if module:
        import importlib.util

        sys.path.insert(0, os.getcwd())  # as python -m looks it up
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:  # a parent package that is missing, or a bad name
            raise ConfigError(f"no module named {printable(target)!r} ({exc})") from None
        finally:
            sys.path.remove(os.getcwd())
        if spec is None:
            raise ConfigError(f"no module named {printable(target)!r}")
        return
    path = Path(target)
    if path.is_dir():
        if not (path / "__main__.py").is_file():
            raise ConfigError(f"{printable(target)} is a folder without __main__.py: give a script")
    elif not path.is_file():
        raise ConfigError(f"no such script: {printable(target)}")
