"""The one spec every door builds: how many steps each phase has, where the run goes, what is said.

The counts left ``None`` come from the one table of defaults, :data:`lmprof.counts.DEFAULT_COUNTS`,
which ``lmprof train`` / ``infer`` / ``run``, ``lmprof.profile()``, the callbacks, the Python API,
their ``--help`` and docs/user-code.md all read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmprof.counts import WATCH_LIMITS, Counts, counts_for
from lmprof.modes import Mode, Traits, traits

if TYPE_CHECKING:
    from lmprof.record.watch import StepSummary


class StepSink(Protocol):
    """Where the watch streams its latest step (``--log-to``: the trackers, which sit above the protocol,
    so the door hands one in). Called at most once a second; a failure ends the stream, never the run."""

    def step(self, folder: Path, summary: "StepSummary") -> None: ...

    def close(self) -> None: ...


@dataclass
class WatchSpec:
    """The whole-run watch (windows/watch.py): after the profiled window, every step until the run ends."""

    max_captures: int = WATCH_LIMITS.max_captures
    min_gap_steps: int = WATCH_LIMITS.min_gap_steps
    sink: StepSink | None = None


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
    watch: WatchSpec | None = None  # watch every step after the profiled window (None: the loop runs on unobserved)

    def draws_plots(self) -> bool:
        """Whether this run draws its PNGs: drawing them costs most of a second (matplotlib)."""
        return self.report if self.plots is None else self.plots

    def counts(self) -> Counts:
        """The counts asked for, the table's where none was given."""
        return counts_for(self.mode, self.warmup, self.steps, self.profile_steps)

    @property
    def traits(self) -> Traits:
        """What the mode is made of (modes.py): whether it trains, what one step is called."""
        return traits(self.mode)

    @property
    def unit(self) -> str:
        """What one step is called in messages and notes."""
        return self.traits.unit
