"""Run sweep points as Ray tasks, one per point, each asking for the device it needs.

Ray is an optional extra (``pip install 'lmprof[ray]'``). Each task runs the same isolated worker
process as the local executor (so a crash, OOM or hang still kills only that point) and returns
the outcome; the driver commits it to the SQLite store as each task finishes. Run folders are
written where the task runs: on one machine, or with a shared filesystem, they land in the sweep
folder as usual.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from lmprof.errors import LmprofError
from lmprof.sweep.runner import Outcome, _now, run_point
from lmprof.sweep.spec import AnyPoint, parse_point


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LmprofError("--executor ray needs Ray: pip install 'lmprof[ray]'") from None
    return ray


def resources_for(point: AnyPoint, cluster_has_gpu: bool) -> dict[str, float]:
    """What Ray must reserve for a point: a GPU for CUDA points (and for ``auto`` on a cluster with
    GPUs, where auto will pick one), else one CPU."""
    wants_gpu = point.device.startswith("cuda") or (point.device == "auto" and cluster_has_gpu)
    return {"num_gpus": 1, "num_cpus": 1} if wants_gpu else {"num_gpus": 0, "num_cpus": 1}


def _task(point_json: str, run_dir: str, timeout_s: float, python: str) -> Outcome:
    return run_point(parse_point(point_json), Path(run_dir), timeout_s, python)


class RayExecutor:
    """Submit every point to a Ray cluster (``address``: "auto", "ray://...", or None for a local one)."""

    def __init__(self, address: str | None = None, init_kwargs: dict[str, Any] | None = None):
        self.address = address
        self.init_kwargs = init_kwargs or {}

    def run(
        self, jobs: list[tuple[AnyPoint, Path]], timeout_s: float, python: str, on_start: Callable[[AnyPoint], None]
    ) -> Iterator[tuple[AnyPoint, Outcome]]:
        ray = _ray()
        started_here = not ray.is_initialized()
        if started_here:
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, **self.init_kwargs)
            except Exception as exc:  # noqa: BLE001 - any connection problem is the user's to fix
                raise LmprofError(f"cannot start or reach Ray at {self.address or 'a local instance'}: "
                                  f"{str(exc).splitlines()[0]}") from None
        remote = ray.remote(_task)
        has_gpu = ray.cluster_resources().get("GPU", 0) > 0
        pending: dict[Any, AnyPoint] = {}
        try:
            for point, run_dir in jobs:
                ref = remote.options(**resources_for(point, has_gpu)).remote(
                    point.model_dump_json(), str(run_dir), timeout_s, python or sys.executable)
                pending[ref] = point
                on_start(point)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    point = pending.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - the task itself died (node lost, ...)
                        outcome = Outcome("error", f"Ray task failed: {str(exc).splitlines()[0]}"[:300],
                                          _now(), _now(), 0.0)
                    yield point, outcome
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()
