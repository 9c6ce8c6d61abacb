"""Run sweep points as Ray tasks, one per point, each asking for the device it needs.

Ray is an optional extra (``pip install 'lmprof[ray]'``). Each task runs the same isolated worker
process as the local executor (so a crash, OOM or hang still kills only that point) and returns
the outcome; the driver commits it to the SQLite store as each task finishes. Run folders are
written where the task runs: on one machine, or with a shared filesystem, they land in the sweep
folder as usual.

CPU share: by default a point reserves a whole node's CPUs (the smallest node's count), so on one
node points run one at a time with every core, as the local executor runs them: points measured side
by side compete for cores and memory bandwidth, and their figures are neither comparable with each
other nor with a local sweep's. ``cpus_per_point`` reserves that many instead (points then run side by
side where a node has room). Either way the point's thread count is set to its share
(``OMP_NUM_THREADS`` and ``torch.set_num_threads``), not left to Ray's default of one thread per
reserved CPU, whatever the node has.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from lmprof.errors import ConfigError
from lmprof.ray_session import ray_session
from lmprof.sweep.runner import Outcome, _now, run_point
from lmprof.sweep.spec import AnyPoint, parse_point
from lmprof.sweep.worker import THREADS_ENV


def resources_for(point: AnyPoint, cluster_has_gpu: bool, cpus: float = 1) -> dict[str, float]:
    """What Ray must reserve for a point: ``cpus`` CPUs, and a GPU for CUDA points (and for ``auto`` on
    a cluster with GPUs, where auto will pick one)."""
    wants_gpu = point.device.startswith("cuda") or (point.device == "auto" and cluster_has_gpu)
    return {"num_gpus": 1 if wants_gpu else 0, "num_cpus": cpus}


def cpu_share(node_cpus: list[float], asked: float | None) -> float:
    """The CPUs a point reserves: ``asked``, else the smallest node's (a whole node: one point at a time
    on it). :class:`ConfigError` when no node has that many."""
    nodes = [c for c in node_cpus if c > 0]
    if not nodes:
        raise ConfigError("the Ray cluster reports no CPUs")
    if asked is None:
        return min(nodes)
    if not (math.isfinite(asked) and asked > 0):
        raise ConfigError(f"--cpus-per-point must be a positive number, not {asked:g}")
    if asked > max(nodes):
        raise ConfigError(f"--cpus-per-point {asked:g}: no Ray node has that many CPUs (the largest has "
                          f"{max(nodes):g})")
    return asked


def threads_for(cpus: float) -> int:
    """A point's thread count for its CPU share (at least one)."""
    return max(1, int(cpus))


def _task(point_json: str, run_dir: str, timeout_s: float, python: str, threads: int) -> Outcome:
    # Ray sets OMP_NUM_THREADS to the reserved CPUs only when the driver did not: the share is said here.
    os.environ["OMP_NUM_THREADS"] = os.environ[THREADS_ENV] = str(threads)
    return run_point(parse_point(point_json), Path(run_dir), timeout_s, python)


class RayExecutor:
    """Submit every point to a Ray cluster (``address``: "auto", "ray://...", or None for a local one)."""

    def __init__(self, address: str | None = None, init_kwargs: dict[str, Any] | None = None,
                 cpus_per_point: float | None = None):
        self.address = address
        self.init_kwargs = init_kwargs or {}
        self.cpus_per_point = cpus_per_point  # None: a whole node per point (see the module)

    def run(
        self, jobs: list[tuple[AnyPoint, Path]], timeout_s: float, python: str, on_start: Callable[[AnyPoint], None]
    ) -> Iterator[tuple[AnyPoint, Outcome]]:
        # ray_session keeps the sweep's own SIGTERM handler (SIGTERM as Ctrl-C: running points back to pending)
        with ray_session(self.address, self.init_kwargs, "--executor ray") as ray:
            remote = ray.remote(_task)
            has_gpu = ray.cluster_resources().get("GPU", 0) > 0
            pending: dict[Any, AnyPoint] = {}
            try:
                nodes = [float(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
                cpus = cpu_share(nodes, self.cpus_per_point)
                for point, run_dir in jobs:
                    ref = remote.options(**resources_for(point, has_gpu, cpus)).remote(
                        point.model_dump_json(), str(run_dir), timeout_s, python or sys.executable, threads_for(cpus))
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
