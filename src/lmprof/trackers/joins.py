"""The tracker runs a user's framework opened, which a callback's figures join.

A framework callback (HF Trainer, Lightning) ends after the framework's own loggers have done their
part: the HF Trainer's MLflow callback has ended its run by then, and Lightning's ``MLFlowLogger`` never
uses MLflow's active run. So each framework's runs are read where the framework keeps them, as a
:class:`Joins`, and the callback's figures are logged into those runs by id
(:func:`lmprof.trackers.export.log_quietly`). Nothing here imports a tracker's package: a tracker the
user's framework uses is imported already.
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MlflowRun:
    """An MLflow run by id: its tracking URI, and the framework's own client where it has one."""

    uri: str
    run_id: str
    client: Any = None


@dataclass(frozen=True)
class Joins:
    """The runs to join, per tracker; None where the framework has none (then: the open run, else a new one)."""

    mlflow: MlflowRun | None = None
    tensorboard: Path | None = None


def _active_mlflow_run() -> MlflowRun | None:
    mlflow = sys.modules.get("mlflow")  # not imported: the user's framework logs nothing to MLflow
    if mlflow is None:
        return None
    try:
        active = mlflow.active_run()
        return None if active is None else MlflowRun(str(mlflow.get_tracking_uri()), active.info.run_id)
    except Exception:  # noqa: BLE001 - a half-configured MLflow: no run to join
        return None


def _trainer_callbacks(depth: int = 8) -> list[Any]:
    """The HF Trainer's callbacks, read from its ``CallbackHandler``, which calls the callback's hooks
    (the handler is not passed to them); [] when none is found on the stack."""
    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            if frame is None:
                break
            owner: Any = frame.f_locals.get("self")
            callbacks = getattr(owner, "callbacks", None)
            if type(owner).__name__ == "CallbackHandler" and isinstance(callbacks, list):
                return list(callbacks)
            frame = frame.f_back
        return []
    finally:
        del frame


def hf_trainer(args: Any) -> Joins:
    """The runs an HF Trainer's reporting callbacks opened (:func:`_hf_trainer`); none on any failure:
    the user's training must go on whatever lmprof fails to read."""
    try:
        return _hf_trainer(args)
    except Exception:  # noqa: BLE001
        return Joins()


def lightning(trainer: Any) -> Joins:
    """The runs a Lightning Trainer's loggers opened (:func:`_lightning`); none on any failure."""
    try:
        return _lightning(trainer)
    except Exception:  # noqa: BLE001
        return Joins()


def _hf_trainer(args: Any) -> Joins:
    """At ``on_train_begin``, after the Trainer's reporting callbacks have opened their runs: the MLflow
    run its ``MLflowCallback`` started (active now, ended before lmprof logs), the folder its
    ``TensorBoardCallback`` writes (``logging_dir``; transformers 5 dropped ``args.logging_dir``:
    ``TENSORBOARD_LOGGING_DIR``, else ``output_dir/runs/<date>_<host>``)."""
    tensorboard = None
    for cb in _trainer_callbacks():
        if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
            tensorboard = Path(cb.logging_dir)
    if tensorboard is None and getattr(args, "logging_dir", None):  # transformers before 5
        tensorboard = Path(args.logging_dir)
    if tensorboard is None and os.environ.get("TENSORBOARD_LOGGING_DIR"):
        tensorboard = Path(os.environ["TENSORBOARD_LOGGING_DIR"]).expanduser()
    return Joins(mlflow=_active_mlflow_run(), tensorboard=tensorboard)


def _lightning(trainer: Any) -> Joins:
    """A Lightning Trainer's loggers: ``MLFlowLogger``'s run (its client, ``experiment``, and
    ``run_id``) and ``TensorBoardLogger``'s ``log_dir``."""
    mlflow_run = tensorboard = None
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__
        if kind == "TensorBoardLogger" and tensorboard is None:
            tensorboard = Path(logger.log_dir)
        elif kind == "MLFlowLogger" and mlflow_run is None:
            try:
                client, rid = logger.experiment, logger.run_id
                uri = getattr(logger, "_tracking_uri", None) or client.tracking_uri
            except Exception:  # noqa: BLE001 - a logger that cannot reach its store: lmprof makes its own run
                continue
            if rid:
                mlflow_run = MlflowRun(str(uri), str(rid), client)
    return Joins(mlflow=mlflow_run or _active_mlflow_run(), tensorboard=tensorboard)
