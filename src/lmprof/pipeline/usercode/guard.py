"""What the doors into someone else's code check before it starts: bad settings are one line (exit 2),
never a failure inside the user's program (later failures: pipeline/protocol/guard.py).

* :func:`check_out` runs before the script (``lmprof run``) or the ``with`` block (``lmprof.profile``):
  a file, an unwritable place, a symlink loop or a name that is not UTF-8 is a ConfigError (exit 2),
  and the folder is made absolute so a script that ``os.chdir()``-s still writes where it was asked.
* :func:`check_counts` and :func:`check_target`: the protocol's counts, the script or module to run.
"""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lmprof.errors import ConfigError
from lmprof.outdir import check_output_dir
from lmprof.pipeline.protocol.guard import why
from lmprof.printable import printable

if TYPE_CHECKING:
    from lmprof.pipeline.protocol.spec import WatchSpec


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


# Checks of what the user gave, made before the script starts (and before torch is imported, so a
# refusal is one line in a fraction of a second).
def check_counts(warmup: int | None, steps: int | None, profile_steps: int | None, *, flags: bool) -> None:
    """Refuse counts the protocol cannot run, in one line naming the option (``--steps`` on the
    command line, ``steps`` in the Python API). ``steps`` may be 0: no clean window, times from the
    profiled steps (marked rough)."""
    from lmprof.counts import count_error
    from lmprof.errors import ConfigError

    for field, value in (("warmup", warmup), ("steps", steps), ("profile_steps", profile_steps)):
        problem = None if value is None else count_error(field, value, zero_steps=True)
        if problem:
            raise ConfigError(f"{'--' + field.replace('_', '-') if flags else field} {problem}")


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


def watch_spec(watch: bool, max_captures: int | None, min_gap: int | None, *, infer: bool, stop_after: bool,
               flags: bool) -> "WatchSpec | None":
    """The whole-run watch's settings (None when not asked for), checked before anything runs: one line
    naming the option for what cannot be watched."""

    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if flags else option

    if not watch:
        for option, value in (("watch_max_captures", max_captures), ("watch_min_gap", min_gap)):
            if value is not None:
                raise ConfigError(f"{name(option)} sets a limit of the watch: add {name('watch')}")
        return None
    for option, value in (("watch_max_captures", max_captures), ("watch_min_gap", min_gap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{name(option)} must be a whole number >= 0, got {value!r}")
    if infer:
        raise ConfigError(f"{name('watch')} follows training steps (optimizer steps); generations are not watched")
    if stop_after:
        raise ConfigError(f"{name('watch')} watches the steps after the profiled window, {name('stop_after')} "
                          "ends the script there: choose one")
    from lmprof.record.watch import pyarrow_missing

    missing = pyarrow_missing()
    if missing is not None:
        raise ConfigError(missing)
    from lmprof.pipeline.protocol.spec import WatchSpec

    spec = WatchSpec()
    if max_captures is not None:
        spec.max_captures = max_captures
    if min_gap is not None:
        spec.min_gap_steps = min_gap
    return spec
