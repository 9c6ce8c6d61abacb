"""Streaming the whole-run watch to a tracker: one step's summary as scalars named by the trackers' rule.

``step_scalars(summary)`` gives ``watch/step_time_ms``, ``watch/device_time_ms``, ``watch/tokens_per_s``,
``watch/loss``, ``watch/input_wait_ms``, ``watch/memory.allocated_B``, ``watch/memory.reserved_B`` and
``watch/rss_B`` (:func:`~lmprof.trackers.content.metric_name`: the unit in the name), those the step has;
the caller logs them at ``summary.step`` with its tracker: :class:`StepStream` does, for the protocol,
under ``lmprof run --watch --log-to``.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from lmprof.record.watch import StepSummary
from lmprof.trackers.content import metric_name
from lmprof.trackers.export import tracker_module

# summary field -> (figure name, unit, factor from the summary's unit)
_FIGURES = {
    "step_s": ("watch/step_time", "ms", 1e3),
    "device_s": ("watch/device_time", "ms", 1e3),
    "tokens_per_s": ("watch/tokens_per_s", "tokens/s", 1.0),
    "loss": ("watch/loss", "", 1.0),  # the script's own loss, in whatever unit it has
    "input_wait_s": ("watch/input_wait", "ms", 1e3),
    "mem_allocated_B": ("watch/memory.allocated", "B", 1.0),
    "mem_reserved_B": ("watch/memory.reserved", "B", 1.0),
    "rss_B": ("watch/rss", "B", 1.0),
}


def step_scalars(summary: StepSummary) -> dict[str, float]:
    """The step's figures as tracker scalars (n/a figures left out)."""
    out = {}
    for field, value in summary.items():
        spec = _FIGURES.get(field)
        if spec is not None and value is not None:
            name, unit, factor = spec
            out[metric_name(name, unit)] = float(value) * factor
    return out


class StepStream:
    """The watched steps to each tracker in ``names`` as the script runs (``lmprof run --watch --log-to``).

    The protocol calls :meth:`step` with the latest step at most once a second (the whole series is in
    the run folder) and :meth:`close` when the run ends. Each tracker's run is opened at the first step
    (the run folder's name is known then), at the tracker's default destination as the run's own
    export uses it, seen from where the script started: TensorBoard writes into the same log folder
    as the run's export (``tensorboard/<run id>``), MLflow and W&B into a run of their own named
    ``<run id> watch`` (tagged / configured with the run id), since the run's export opens its own when
    the script ends. Whatever a tracker library prints goes to stderr (the script's stdout stays its
    own); a tracker that fails is one line on stderr and is dropped, the others go on.
    """

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.root = Path.cwd()  # the default destinations are relative to where the script started
        self._open: dict[str, Any] = {}

    def step(self, folder: Path, summary: StepSummary) -> None:
        scalars = step_scalars(summary)
        for name in list(self.names):
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    if name not in self._open:
                        self._open[name] = _OPENERS[name](self.root, folder.name)
                    self._open[name].log(scalars, summary.step)
            except Exception as exc:  # noqa: BLE001 - the user's program goes on whatever a tracker does
                self.names.remove(name)
                msg = " ".join(str(exc).split())[:200]
                print(f"lmprof: streaming the watch to {name} failed ({type(exc).__name__}: {msg}); the series "
                      f"stays in {folder}", file=sys.stderr, flush=True)

    def close(self) -> None:
        for name, handle in self._open.items():
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    handle.close()
            except Exception as exc:  # noqa: BLE001
                print(f"lmprof: closing the watch's {name} run failed ({type(exc).__name__})", file=sys.stderr)
        self._open.clear()


def _default_dest(name: str) -> Any:
    """Where the run's own export goes by default: the exporter's ``DEFAULT_DEST`` (None: the tracker's
    own default, MLflow's tracking URI)."""
    return getattr(tracker_module(name), "DEFAULT_DEST", None)


class _TensorBoard:
    def __init__(self, root: Path, run_id: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(root / _default_dest("tensorboard") / run_id))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, root: Path, run_id: str):
        from mlflow.tracking import MlflowClient

        mod = tracker_module("mlflow")
        dest = _default_dest("mlflow")
        self.uri = mod.tracking_uri(root / dest if dest is not None else None)
        # what the exporter sets around a write (a file store allowed), under either name it has had
        self._allow = getattr(mod, "scoped_env", None) or mod.allow_file_store
        with self._allow(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name("lmprof")
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment("lmprof")
            self.rid = self.client.create_run(exp_id, run_name=f"{run_id} watch",
                                              tags={"lmprof.run_id": run_id, "lmprof.watch": "true"}).info.run_id

    def log(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._allow(self.uri):
            self.client.log_batch(self.rid, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        with self._allow(self.uri):
            self.client.set_terminated(self.rid)


class _WandB:
    def __init__(self, root: Path, run_id: str):
        import wandb

        mode: Any = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(project="lmprof", name=f"{run_id} watch", dir=str(root / (_default_dest("wandb") or ".")),
                              mode=mode, job_type="watch", config={"lmprof": {"run_id": run_id}},
                              reinit="create_new", settings=wandb.Settings(silent=True))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


_OPENERS: dict[str, Callable[[Path, str], Any]] = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}
