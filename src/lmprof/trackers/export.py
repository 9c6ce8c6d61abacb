"""``export``: one run folder, or every point of a sweep folder, to one tracker.

The tracker's package is looked up before anything is written; a missing one is one line naming the
extra to install (exit 2 in the CLI).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from lmprof.errors import ConfigError, DataError, LmprofError
from lmprof.outdir import check_output_dir
from lmprof.record.run import Run
from lmprof.trackers.content import sweep_points

# tracker -> (the package it needs, lmprof's extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
DEFAULT_DEST = {"tensorboard": "tensorboard", "mlflow": "mlruns", "wandb": "."}


def tracker_module(to: str) -> ModuleType:
    """The exporter module for ``to``; :class:`ConfigError` for an unknown tracker or a missing package."""
    if to not in TRACKERS:
        raise ConfigError(f"unknown tracker {to!r}: expected one of {', '.join(TRACKERS)}")
    package, extra = TRACKERS[to]
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"exporting to {to} needs the {package} package: pip install 'lmprof[{extra}]'")
    try:  # installed is not importable: a broken install fails here, in one line, not mid-export
        importlib.import_module(package)
    except Exception as exc:  # noqa: BLE001 - whatever the package raises while importing
        msg = " ".join(str(exc).split())[:160]
        raise ConfigError(f"exporting to {to} needs the {package} package, which is installed but fails to import "
                          f"({type(exc).__name__}: {msg}): pip install --force-reinstall 'lmprof[{extra}]'") from None
    return importlib.import_module(f"lmprof.trackers.to_{to}")


def _check_dest(to: str, dest: str | Path | None) -> None:
    """A local destination that cannot be written (read-only, a file where a folder belongs) is one line
    before anything is exported; a tracking URI other than ``file:`` is the tracker's to judge."""
    text = str(dest if dest is not None else DEFAULT_DEST[to])
    if text.startswith("file:"):
        from urllib.parse import unquote, urlparse

        text = unquote(urlparse(text).path)
    elif "://" in text:
        return
    check_output_dir(text, "--dest")


def export(run: Run, to: str, dest: str | Path | None = None, *, project: str = "lmprof",
           group: str | None = None) -> str:
    """Log one run (loaded from its folder) to tracker ``to``; returns where it went, in words."""
    mod = tracker_module(to)
    return str(mod.export_run(run, Path(dest if dest is not None else DEFAULT_DEST[to]), project=project,
                              group=group))


def export_folder(folder: str | Path, to: str, dest: str | Path | None = None, *,
                  project: str = "lmprof") -> list[str]:
    """Export a run folder, or a sweep folder as one tracker run per point grouped under the sweep's name."""
    path = Path(folder)
    tracker_module(to)  # a missing package is said before any run is read
    _check_dest(to, dest)
    if (path / "run.json").is_file():
        return [export(Run.load(path), to, dest, project=project)]
    points = sweep_points(path)
    if not points:
        raise DataError(f"{path} is neither a run folder (no run.json) nor a sweep folder with finished points")
    group = path.resolve().name
    return [export(Run.load(p), to, dest, project=project, group=group) for p in points]


def check_trackers(names: list[str]) -> None:
    """Refuse unknown trackers or missing packages before a run starts (``--log-to``), not after it."""
    for name in names:
        tracker_module(name)


def log_to(folder: str | Path, names: list[str]) -> list[str]:
    """``--log-to``: export a freshly written run folder to each tracker at its default destination.

    A tracker's own failure becomes one :class:`LmprofError` line that says the run folder is kept.
    """
    done = []
    for name in names:
        try:
            done += [f"{name}: {w}" for w in export_folder(folder, name)]
        except LmprofError:
            raise
        except Exception as exc:  # the tracker library's own error: the run itself is safe on disk
            msg = " ".join(str(exc).split())[:200]
            raise LmprofError(f"logging to {name} failed ({type(exc).__name__}: {msg}); the run folder "
                              f"{folder} is kept: lmprof export {folder} --to {name}") from None
    return done


def _one_line(name: str, where: object, exc: BaseException) -> str:
    msg = " ".join(str(exc).split())[:200]
    what = exc.__class__.__name__
    return (f"lmprof: logging to {name} failed ({what}: {msg}); the run folder {where} is kept: "
            f"lmprof export {where} --to {name}")


def log_quietly(folder: str | Path, names: Sequence[str], *, group: str | None = None,
                open_run: bool = False, tensorboard_dir: str | Path | None = None) -> list[str]:
    """Export a run folder to each tracker where a failure must never reach the caller: under
    ``lmprof run``, the framework callbacks and each point of ``lmprof sweep``.

    A tracker's failure (any exception, its package missing included) is one line on stderr and the
    next tracker is tried; whatever the tracker libraries print goes to stderr, so the user's stdout
    stays theirs. With ``open_run`` (the callbacks), a run the user's tracker already has open takes
    the figures: ``mlflow.active_run()``, ``wandb.run``, or for TensorBoard the log folder the framework
    writes to (``tensorboard_dir``); without one, a new tracker run at the default destination.
    ``group`` puts a sweep's points in one group / experiment. Returns what went where, in words.
    """
    done: list[str] = []
    for name in names:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                mod = tracker_module(name)
                run = Run.load(folder)
                where = None
                if open_run and name == "tensorboard" and tensorboard_dir is not None:
                    where = mod.export_into(run, Path(tensorboard_dir))
                elif open_run and name != "tensorboard":
                    where = mod.export_open_run(run)
                if where is None:
                    where = export(run, name, group=group)
            done.append(f"{name}: {where}")
        except Exception as exc:  # noqa: BLE001 - the user's program goes on whatever a tracker does
            print(_one_line(name, folder, exc), file=sys.stderr, flush=True)
    return done
