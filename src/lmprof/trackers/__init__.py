"""Exporters of run folders to experiment trackers: TensorBoard, MLflow, Weights & Biases.

Each tracker is an optional extra (``pip install 'lmprof[tensorboard]'``, ``[mlflow]``, ``[wandb]``),
imported only when an export to it is asked for, and each writes offline: TensorBoard event files,
an MLflow file store, a W&B offline run. :func:`export` is the one entry point.
"""
from __future__ import annotations

from lmprof.trackers.export import TRACKERS, export, export_folder

__all__ = ["TRACKERS", "export", "export_folder"]
