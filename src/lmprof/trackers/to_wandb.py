"""Weights & Biases: one W&B run per lmprof run, offline unless the caller's environment says otherwise.

The run is written under ``dest/wandb/offline-run-*`` (``wandb sync`` uploads it later); ``project``
and ``group`` (a sweep's name) are W&B's own. Figures go to the run summary (unit in the name) and
are logged once at step 0, their units and spreads in a ``figures`` table; the config is the W&B
config (nested, as run.json has it); blocks are a ``blocks`` table, plots images under ``plots/``,
and the report, trace, run.json and CSVs an artifact of type ``lmprof-run``; each block's time is also
a value ``blocks/<block>/<phase>_ms`` a dashboard charts across runs.

The W&B run id is kept in the run folder (:mod:`~lmprof.trackers.ledger`): a second export to the same
folder and project resumes that W&B run (``id=``, ``resume="allow"``); offline, W&B writes it as a new
``offline-run-*`` folder with the same id, which ``wandb sync`` uploads into the one run.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lmprof.record.run import Run
from lmprof.trackers import ledger
from lmprof.trackers.content import BLOCK_COLUMNS, artifacts, block_rows, block_scalars, figures, plots


DEFAULT_DEST = "."  # W&B writes its own wandb/ folder under it


def export_run(run: Run, dest: str | None, *, project: str, group: str | None) -> str:
    """Log ``run`` to W&B (offline by default) under ``dest``; returns the W&B run's folder."""
    import wandb

    root = Path(dest if dest is not None else DEFAULT_DEST)
    root.mkdir(parents=True, exist_ok=True)
    mode: Any = os.environ.get("WANDB_MODE", "offline")
    config = {**run.config, "lmprof": {"run_id": run.id, "mode": run.mode, "device": run.env.device}}
    folder = Path(run.folder) if run.folder is not None else None
    where = f"{root.resolve()} {project}"
    earlier = ledger.recall(folder, "wandb", where) if folder is not None else None
    wb = wandb.init(project=project, group=group, name=run.id, dir=str(root), mode=mode, config=config,
                    job_type=run.mode, reinit="create_new", settings=wandb.Settings(silent=True),
                    id=earlier, resume="allow" if earlier is not None else None)
    try:
        if folder is not None and earlier is None:
            ledger.remember(folder, "wandb", where, str(wb.id))
        # A resumed run's step counter is past 0: a step-0 record there would be dropped.
        _log(wb, run, prefix="", at_step_0=earlier is None)
        where = str(wb.dir)
    finally:
        wb.finish()
    return str(Path(where).parent) + (" (updated)" if earlier is not None else "")


def export_open_run(run: Run) -> str | None:
    """Log ``run`` into the W&B run the caller has open (``wandb.run``), left open, every name under
    ``lmprof/`` and the config under ``lmprof``; None when none is open."""
    import wandb

    wb: Any = wandb.run
    if wb is None:
        return None
    wb.config.update({"lmprof": {**run.config, "run_id": run.id, "mode": run.mode, "device": run.env.device}},
                     allow_val_change=True)
    _log(wb, run, prefix="lmprof/", at_step_0=False)
    return f"the open run {wb.id} ({wb.dir})"


def _log(wb: Any, run: Run, *, prefix: str, at_step_0: bool) -> None:
    import wandb

    figs = figures(run)
    data: dict[str, Any] = {f"{prefix}{f.name}": f.value for f in figs}
    data.update({f"{prefix}{name}": value for name, value in block_scalars(run)})
    data[f"{prefix}figures"] = wandb.Table(columns=["figure", "logged as", "value", "unit", "source", "p10", "p90", "n"],
                                           data=[[f.key, f"{prefix}{f.name}", f.value, f.unit, f.source, f.p10, f.p90,
                                                  f.n] for f in figs])
    if run.blocks:
        rows: list[Any] = block_rows(run)
        data[f"{prefix}blocks"] = wandb.Table(columns=list(BLOCK_COLUMNS), data=rows)
    for png in plots(run):
        data[f"{prefix}plots/{png.stem}"] = wandb.Image(str(png))
    # Into the caller's run (or a resumed one), W&B's own step counter goes on (a step 0 behind it would
    # be dropped).
    if at_step_0:
        wb.log(data, step=0)
    else:
        wb.log(data)
    files = artifacts(run)
    if files:
        art = wandb.Artifact(re.sub(r"[^A-Za-z0-9._-]", "-", f"lmprof-{run.id}"), type="lmprof-run")
        for path in files:
            art.add_file(str(path))
        wb.log_artifact(art)
