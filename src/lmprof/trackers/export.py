"""``export``: one run folder, or every point of a sweep folder, to one tracker.

The tracker's package is looked up before anything is written; a missing one is one line naming the
extra to install (exit 2 in the CLI).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from lmprof.errors import ConfigError, DataError, LmprofError
from lmprof.outdir import check_output_dir
from lmprof.record.run import Run
from lmprof.trackers.content import sweep_points
from lmprof.trackers.joins import Joins

# tracker -> (the package it needs, lmprof's extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def tracker_module(to: str) -> ModuleType:
    """The exporter module for ``to``; :class:`ConfigError` for an unknown tracker or a missing package."""
    if to not in TRACKERS:
        raise ConfigError(f"unknown tracker {to!r}: expected one of {', '.join(TRACKERS)}")
    package, extra = TRACKERS[to]
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"exporting to {to} needs the {package} package: pip install 'lmprof[{extra}]'")
    try:  # installed is not importable: a broken install fails here, in one line, not mid-export
        importlib.import_module(package)  # the exporters import it only when they export
        return importlib.import_module(f"lmprof.trackers.to_{to}")
    except Exception as exc:  # noqa: BLE001 - a tracker package that is installed but broken
        raise ConfigError(f"the {package} package is installed but fails to import ({_said(exc)}): "
                          f"pip install --force-reinstall 'lmprof[{extra}]'") from None


def _said(exc: BaseException) -> str:
    """An exception as a short phrase on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


class TrackerError(LmprofError):
    """A tracker library's own failure during an export; ``reason`` is what it said, in one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TrackerError):
        return exc.reason
    return str(exc) if isinstance(exc, LmprofError) else _said(exc)


def _check_dest(to: str, dest: str | Path | None) -> None:
    """A local destination that cannot be written (read-only, a file where a folder belongs) is one line
    before anything is exported; a tracking URI other than ``file:`` is the tracker's to judge."""
    if dest is None:  # the tracker's default: a folder (TensorBoard, W&B) or MLflow's own tracking URI
        dest = getattr(tracker_module(to), "DEFAULT_DEST", None)
        if dest is None:
            return
    text = str(dest)
    if text.startswith("file:"):
        from urllib.parse import unquote, urlparse

        text = unquote(urlparse(text).path)
    elif "://" in text:
        return
    check_output_dir(text, "--dest")


def export(run: Run, to: str, dest: str | Path | None = None, *, project: str = "lmprof",
           group: str | None = None) -> str:
    """Log one run (loaded from its folder) to tracker ``to``; returns where it went, in words.

    ``dest`` is taken as given (an MLflow URI is not a path: ``sqlite:///x.db``, ``http://host:5000``);
    None is the tracker's default (docs/trackers.md). The tracker library's own failure (a server
    that refuses, a folder that cannot be written) is one :class:`LmprofError` line."""
    mod = tracker_module(to)
    where = None if dest is None else os.fspath(dest)
    try:
        return str(mod.export_run(run, where, project=project, group=group))
    except LmprofError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's own error, said in one line
        reason = _said(exc)
        raise TrackerError(f"exporting {run.folder or run.id} to {to} failed ({reason})", reason) from None


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
    """Refuse unknown trackers, missing packages and a destination that cannot work (an MLflow server
    that does not answer) before a run starts (``--log-to``), not after it."""
    for name in names:
        check = getattr(tracker_module(name), "check_default", None)
        if check is not None:
            check()


def log_to(folder: str | Path, names: list[str]) -> list[str]:
    """``--log-to``: export a freshly written run folder to each tracker at its default destination.

    A tracker's own failure becomes one :class:`LmprofError` line that says the run folder is kept.
    """
    done = []
    for name in names:
        try:
            done += [f"{name}: {w}" for w in export_folder(folder, name)]
        except Exception as exc:  # noqa: BLE001 - the run itself is safe on disk: say so, and how to retry
            raise LmprofError(_failed(name, folder, exc)) from None
    return done


def _failed(name: str, where: object, exc: BaseException) -> str:
    return f"logging to {name} failed ({_reason(exc)}); the run folder {where} is kept: lmprof export {where} --to {name}"


def _one_line(name: str, where: object, exc: BaseException) -> str:
    return f"lmprof: {_failed(name, where, exc)}"


def log_quietly(folder: str | Path, names: Sequence[str], *, group: str | None = None,
                joins: Joins | None = None) -> list[str]:
    """Export a run folder to each tracker where a failure must never reach the caller: under
    ``lmprof run``, the framework callbacks and each point of ``lmprof sweep``.

    A tracker's failure (any exception, its package missing included) is one line on stderr and the
    next tracker is tried; whatever the tracker libraries print goes to stderr, so the user's stdout
    stays theirs. With ``joins`` (the callbacks), the runs the user's framework opened take the
    figures: its MLflow run by id (or ``mlflow.active_run()``), its TensorBoard log folder, the open
    W&B run (``wandb.run``); without one, a new tracker run at the default destination. ``group`` puts
    a sweep's points in one group / experiment. Returns what went where, in words.
    """
    done: list[str] = []
    for name in names:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                done.append(f"{name}: {_log_one(Run.load(folder), name, group, joins)}")
        except Exception as exc:  # noqa: BLE001 - the user's program goes on whatever a tracker does
            print(_one_line(name, folder, exc), file=sys.stderr, flush=True)
    return done


def _log_one(run: Run, name: str, group: str | None, joins: Joins | None) -> str:
    mod = tracker_module(name)
    where = None
    if joins is not None:
        if name == "tensorboard" and joins.tensorboard is not None:
            where = mod.export_into(run, joins.tensorboard)
        elif name == "mlflow" and joins.mlflow is not None:
            where = mod.export_into_run(run, joins.mlflow.uri, joins.mlflow.run_id, client=joins.mlflow.client)
        elif name != "tensorboard":
            where = mod.export_open_run(run)
    return str(where) if where is not None else export(run, name, group=group)
