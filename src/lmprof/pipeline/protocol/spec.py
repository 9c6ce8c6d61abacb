"""The one spec every door builds: how many steps each phase has, where the run goes, what is said.

The counts left ``None`` come from the one table of defaults, :data:`lmprof.counts.DEFAULT_COUNTS`,
which ``lmprof train`` / ``infer`` / ``run``, ``lmprof.profile()``, the callbacks, the Python API,
their ``--help`` and docs/user-code.md all read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmprof.counts import Counts, counts_for

Mode = Literal["train", "infer"]


@dataclass
class Spec:
    """How a session measures, where it writes and what it prints."""

    mode: Mode = "train"
    warmup: int | None = None  # None: the table's
    steps: int | None = None
    profile_steps: int | None = None
    out: str | Path = "runs"
    run_dir: Path | None = None  # exact folder (torchrun ranks, a sweep point); else a new folder under ``out``
    label: str = "script"
    report: bool = True
    stop_after: bool = False
    verbose: bool = True  # print the summary (to stderr) when the run is written
    energy: str = "auto"  # the energy meter over the clean window (as lmprof train's --energy)
    tdp_w: float | None = None
    plots: bool | None = None  # roofline.png and memory.png; None: drawn when the report is written
    config: dict[str, Any] = field(default_factory=dict)  # extra facts for run.json's config

    def draws_plots(self) -> bool:
        """Whether this run draws its PNGs: drawing them costs most of a second (matplotlib)."""
        return self.report if self.plots is None else self.plots

    def counts(self) -> Counts:
        """The counts asked for, the table's where none was given."""
        return counts_for(self.mode, self.warmup, self.steps, self.profile_steps)

    @property
    def unit(self) -> str:
        """What one step is called in messages and notes."""
        return "generation" if self.mode == "infer" else "step"
