"""``lmprof run --nproc N``: a door that runs the script on N ranks through torchrun, one rank folder each.

The script sets up its own process group and DDP as it would under torchrun; each rank runs
``lmprof run --run-dir <run>`` and writes ``<run>/rank<r>``. This (parent) process then assembles
``<run>/run.json`` as ``lmprof train --nproc`` does, and prints the summary. The script's output is
not captured: it goes where the ranks' output goes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from lmprof.hardware.devices import resolve_device
from lmprof.pipeline import distributed as dist
from lmprof.pipeline.protocol.folder import run_folder
from lmprof.pipeline.protocol.guard import safe_name
from lmprof.pipeline.protocol.spec import WatchSpec


def launch_script(target: str, script_args: list[str], *, module: bool, nproc: int, out: str, report: bool,
                  infer: bool, steps: int | None, warmup: int | None, profile_steps: int | None,
                  stop_after: bool, plots: bool = False, watch: WatchSpec | None = None) -> int:
    """Run the script on ``nproc`` ranks; return torchrun's exit code (the script's, as ranks keep it)."""
    label = safe_name(target.rsplit(".", 1)[-1] if module else Path(target).stem) + f"-ddp{nproc}"
    run_dir = run_folder(out, "infer" if infer else "train", label, resolve_device("auto"))
    run_dir.mkdir(parents=True, exist_ok=True)
    argv: list[str] = ["run", "--run-dir", str(run_dir), "--out", out]
    for flag, value in (("--steps", steps), ("--warmup", warmup), ("--profile-steps", profile_steps)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--infer"] if infer else []
    argv += ["--stop-after"] if stop_after else []
    argv += ["--plots" if plots else "--no-plots"]  # a rank writes no report: the launcher decided
    if watch is not None:  # each rank watches its own steps; the parent merges them and compares the ranks
        argv += ["--watch", "--watch-max-captures", str(watch.max_captures),
                 "--watch-min-gap", str(watch.min_gap_steps)]
    argv += ["-m", target] if module else [target]
    argv += script_args
    env = dict(os.environ, LMPROF_DIST_TIMEOUT=str(dist.DEFAULT_TIMEOUT_S))
    code = dist.run_torchrun(dist.torchrun_command(nproc, argv), env, None, capture=False).returncode
    written = [r for r in range(nproc) if (run_dir / f"rank{r}" / "run.json").is_file()]
    if len(written) != nproc:
        print(f"lmprof: {len(written)} of {nproc} ranks wrote a run (torchrun exit code {code}); "
              f"rank folders are in {run_dir}", file=sys.stderr)
        return code
    run = dist.assemble(run_dir, nproc)
    from lmprof.show.summary import print_summary

    print_summary(run, run_dir, sys.stderr, report=report)
    return code


