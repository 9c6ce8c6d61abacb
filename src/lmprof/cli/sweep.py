"""``lmprof sweep SPEC.yaml``: run a grid of configurations, each point isolated in its own process."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, List, Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import console
from lmprof.errors import ConfigError


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    # SIGTERM (CI cancel, `kill`) takes the Ctrl-C path: the running worker is killed and its point
    # is put back to pending before the sweep exits.
    raise KeyboardInterrupt


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="Sweep spec (YAML): lists to take the product of, see docs/sweeps.md"),
    out: Path = typer.Option(Path("sweeps-out"), "--out", "-o", help="Sweep folder: results.sqlite and runs/"),
    resume: bool = typer.Option(False, "--resume", help="Continue the sweep in --out: skip points already ok"),
    skip_failed: bool = typer.Option(False, "--skip-failed", help="With --resume: keep failed points as they are"),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the points and exit without running them"),
    strict: bool = typer.Option(False, "--strict", hidden=True,
                                help="Kept for old scripts: exit code 1 on a failed point is now the default"),
    executor: str = typer.Option("local", "--executor", help="local (one point after another) or ray (Ray tasks)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (e.g. auto); default: a local Ray"),
    cpus_per_point: Optional[float] = typer.Option(None, "--cpus-per-point", help="With --executor ray: CPUs each point "
                                                   "reserves, its thread count [default: a whole node, one point at a "
                                                   "time on it; docs/sweeps.md]"),
    log_to: List[str] = typer.Option([], "--log-to", help="Also export each finished point to tensorboard, mlflow or "
                                     "wandb, one tracker run per point in one group (repeatable; docs/trackers.md)"),
) -> None:
    """Run every configuration of a sweep spec; each point's status and metrics go to results.sqlite."""
    from lmprof.sweep.progress import ConsoleProgress, duration
    from lmprof.sweep.runner import run_sweep
    from lmprof.outdir import check_output_dir
    from lmprof.safeyaml import short_repr
    from lmprof.sweep.spec import load_spec

    from lmprof.measure.native_logs import quiet_process

    # Before anything imports torch (the spec's presets do): this process, the workers' fork server
    # and the workers inherit the log levels, so worker.log holds no kineto lines.
    quiet_process()
    if executor not in ("local", "ray"):
        raise ConfigError(f"unknown --executor {executor!r}: use local or ray")
    runner_executor = None
    if cpus_per_point is not None and executor != "ray":
        raise ConfigError("--cpus-per-point is for --executor ray (the local executor runs one point at a time)")
    if executor == "ray":
        from lmprof.sweep.ray_executor import RayExecutor

        runner_executor = RayExecutor(address, cpus_per_point=cpus_per_point)
    sweep_spec = load_spec(spec)
    if not dry_run:
        check_output_dir(out, "--out")
    if log_to:  # an unknown tracker or a missing package is said before any point runs
        from lmprof.trackers.export import check_trackers

        check_trackers(log_to)
    plan = sweep_spec.expand()
    n = len(plan.points)
    console.print(f"sweep {spec}: {n} point{'' if n == 1 else 's'}"
                  + (f" ({plan.excluded} excluded by the rules)" if plan.excluded else "")
                  + (f", {sweep_spec.repeats} repeats each" if sweep_spec.repeats > 1 else "")
                  + f", timeout {sweep_spec.timeout_s:g} s per point -> {out}")
    for rule in plan.unused_rules:
        console.print(f"note: exclude rule {short_repr(rule)} matches no point (a typo?)")
    if dry_run:
        for p in plan.points:
            console.print(f"  {p.id}  {p.label}")
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        summary = run_sweep(sweep_spec, out, resume=resume, retry_failed=not skip_failed,
                            listener=_logging(ConsoleProgress(console), log_to, out), executor=runner_executor)
    except KeyboardInterrupt:
        console.print(f"interrupted: finished points are saved; continue with: "
                      f"lmprof sweep {spec} --out {out} --resume")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if summary.skipped_failed:
        console.print(f"resume: {summary.skipped_failed} failed points kept as they are (--skip-failed)")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.counts.items())) or "nothing to run"
    console.print(f"finished in {duration(summary.duration_s)}: {counts}")
    console.print(f"results: {out / 'results.sqlite'}  (lmprof results {out}; lmprof plots {out})")
    if summary.failed or summary.skipped_failed:
        # A sweep whose results hold failed points is not a success, in CI or a shell's `&&`.
        console.print(f"{summary.failed + summary.skipped_failed} point(s) failed: exit code 1 "
                      f"(see `lmprof results {out}`)")
        raise typer.Exit(1)


def _logging(listener: Any, trackers: List[str], out: Path) -> Any:
    """The progress listener, plus (with --log-to) each ok point exported as soon as it is recorded.

    Points are logged as they finish, so a resumed sweep logs only the points it runs. A tracker's
    failure is one line on stderr and the sweep goes on: the point is in the store and its folder.
    """
    if not trackers:
        return listener
    from lmprof.sweep.runner import RUNS_DIR
    from lmprof.trackers.export import log_quietly

    group = out.resolve().name  # the group `lmprof export SWEEP` uses too

    class Logging:
        def begin(self, total: int, todo: int, skipped_ok: int) -> None:
            listener.begin(total, todo, skipped_ok)

        def point_started(self, point: Any, index: int) -> None:
            listener.point_started(point, index)

        def point_finished(self, point: Any, outcome: Any, headline: str) -> None:
            listener.point_finished(point, outcome, headline)
            if outcome.status == "ok":
                log_quietly(out / RUNS_DIR / point.id, trackers, group=group)

        def end(self, summary: Any) -> None:
            listener.end(summary)

    return Logging()
