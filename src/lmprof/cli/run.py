"""``lmprof run``: profile your own script, unchanged (``lmprof run train.py --lr 3e-4``)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from lmprof.cli.app import app
from lmprof.counts import WATCH_LIMITS, default_help

# Options end at the script's name: everything after it is the script's own (its --steps is not ours).
_SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


@app.command(context_settings=_SETTINGS)
def run(
    argv: Optional[List[str]] = typer.Argument(None, metavar="SCRIPT [ARGS]...", help="The script and its own arguments"),
    module: bool = typer.Option(False, "-m", "--module", help="SCRIPT is a module name, run as `python -m` does"),
    infer: bool = typer.Option(False, "--infer", help="Profile Hugging Face generate() calls: prefill vs decode"),
    steps: Optional[int] = typer.Option(None, help=f"Clean timed steps, 0 for none {default_help('train', 'steps')}; "
                                        f"--infer: generations {default_help('infer', 'steps')}"),
    warmup: Optional[int] = typer.Option(None, help=f"Warm-up steps, not measured {default_help('train', 'warmup')}; "
                                         f"--infer: {default_help('infer', 'warmup')}"),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help="Steps under the profiler "
                                                f"{default_help('train', 'profile_steps')}; --infer: "
                                                f"{default_help('infer', 'profile_steps')}"),
    out: str = typer.Option("runs", help="Folder that receives the run folder"),
    stop_after: bool = typer.Option(False, "--stop-after", help="End the script once the run is written"),
    report: bool = typer.Option(True, "--report/--no-report", help="Write report.html into the run folder"),
    plots: Optional[bool] = typer.Option(None, "--plots/--no-plots", help="Draw roofline.png and memory.png [default: with the report or --log-to]"),
    nproc: int = typer.Option(1, "--nproc", help="> 1: launch the script on this many ranks with torchrun"),
    log_to: List[str] = typer.Option([], "--log-to", help="Also export the run to tensorboard, mlflow or wandb "
                                     "once the script ends (repeatable; offline: docs/trackers.md)"),
    watch: bool = typer.Option(False, "--watch", help="After the profiled window, watch every step until the script "
                               "ends: step time, memory, input wait; alerts, and a window profiled by itself when "
                               "something changes (docs/user-code.md)"),
    watch_max_captures: Optional[int] = typer.Option(None, "--watch-max-captures", help="--watch: windows captured "
                                                     f"in the run at most [default: {WATCH_LIMITS.max_captures}]"),
    watch_min_gap: Optional[int] = typer.Option(None, "--watch-min-gap", help="--watch: steps between two captures "
                                                f"alerts ask for, at least [default: {WATCH_LIMITS.min_gap_steps}]"),
    verbose: bool = typer.Option(False, "--verbose", help="Also show torch's own C++ log lines around lmprof's profiler windows"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", hidden=True, help="Exact run folder (torchrun ranks, sweep points)"),
) -> int:
    """Profile your own training (or, with --infer, generation) script, unchanged: warm-up, clean
    timed steps, then a profiled window attributed per block, written as a run folder. The script's
    stdout is left alone (the summary goes to stderr) and its exit code is kept."""
    from lmprof.errors import ConfigError
    from lmprof.pipeline.usercode.guard import check_counts, check_out, check_target, watch_spec
    from lmprof.printable import printable

    args = list(argv or [])
    if not args:
        raise ConfigError("give a script to run (lmprof run train.py [its args]) or -m package.module")
    target, script_args = args[0], args[1:]
    # what the user gave is checked before torch is imported: a refusal is one quick line
    check_counts(warmup, steps, profile_steps, flags=True)
    from lmprof.config import check_nproc

    check_nproc(nproc)
    check_target(target, module)
    watching = watch_spec(watch, watch_max_captures, watch_min_gap, infer=infer, stop_after=stop_after, flags=True)
    if log_to:  # an unknown tracker or a missing package is said before the script starts
        from lmprof.trackers.export import check_trackers

        if nproc > 1:
            raise ConfigError("--log-to is not supported with --nproc yet: export the run folder afterwards "
                              "with lmprof export RUN --to TRACKER")
        check_trackers(log_to)
    out_dir = check_out(out)  # before the script starts; absolute, so a script's os.chdir() changes nothing
    from lmprof.measure.native_logs import set_verbose
    from lmprof.pipeline.protocol.spec import Spec
    from lmprof.pipeline.usercode.script import run_script

    set_verbose(verbose)  # the script's process: only lmprof's own windows are kept quiet, never by log level
    draw = plots if plots is not None else report or bool(log_to)
    if nproc > 1:
        from lmprof.pipeline.usercode.ranks import launch_script

        return launch_script(target, script_args, module=module, nproc=nproc, out=str(out_dir), report=report, infer=infer,
                             steps=steps, warmup=warmup, profile_steps=profile_steps, stop_after=stop_after,
                             plots=draw, watch=watching)
    label = Path(target).resolve().name if Path(target).is_dir() else Path(target).stem
    label = target.rsplit(".", 1)[-1] if module else label
    spec = Spec(mode="infer" if infer else "train", warmup=warmup, steps=steps, profile_steps=profile_steps,
                out=out_dir, label=label, report=report, stop_after=stop_after, plots=draw, watch=watching,
                config={"script": printable(f"-m {target}" if module else target),
                        "script_args": [printable(a) for a in script_args]})
    from lmprof.pipeline.distributed import world

    rank, _, world_size = world()
    if world_size > 1:  # a rank under torchrun: its own folder, quiet; the launcher assembles and prints
        if run_dir is None:
            raise ConfigError("under torchrun, use lmprof run --nproc N (it launches torchrun itself)")
        spec.run_dir, spec.verbose, spec.report = run_dir / f"rank{rank}", False, False
        spec.config.update(rank=rank, world_size=world_size)
    elif run_dir is not None:  # one process with an exact folder: a sweep point's runs/<id> (sweep/script.py)
        spec.run_dir = run_dir
    if watching is not None and log_to:  # the watched steps stream to the trackers as the script runs
        from lmprof.trackers.watch import StepStream

        watching.sink = StepStream(log_to)
    result = run_script(target, script_args, spec, module=module)
    from lmprof.pipeline.protocol.say import say  # the script may have closed sys.stderr

    if result.session.message:
        say(f"lmprof: {result.session.message}")
    folder = result.session.folder
    if log_to and result.signal is None and result.session.run is not None and folder is not None:
        # After the script: a tracker's failure is one line on stderr, never the script's exit code.
        from lmprof.trackers.export import log_quietly

        for line in log_quietly(folder, log_to):
            say(f"lmprof: logged to {line}")
    if result.signal is not None:  # ended by a signal: end the way it would have without lmprof
        from lmprof.pipeline.protocol.ending import die_by

        die_by(result.signal)
    if world_size > 1:  # a rank: leave without joining gloo's threads (see end_rank_process)
        from lmprof.pipeline.distributed import end_rank_process

        end_rank_process(result.exit_code)
    return result.exit_code
