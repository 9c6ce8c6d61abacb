"""The whole-run watch of a torchrun run: every rank watched its own steps; the parent's ``watch`` section
merges them and names the rank that fell behind (:func:`~lmprof.analysis.watch_detect.stragglers`).

Under a synchronising loop (DDP) every rank's wall step time is the slowest rank's, so the ranks are
compared by their **input wait** (a rank whose loader falls behind), and by their step time for loops
that do not synchronise. The series are read column by column and compared in blocks of steps (with
a window's overlap), so a long run's comparison holds one block at a time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from lmprof.analysis.watch_detect import Rules, stragglers
from lmprof.errors import DataError
from lmprof.record.run import Metric, Run, WatchAlert, WatchCapture, WatchSection
from lmprof.record.watch import read_series

BLOCK = 16384  # common steps compared at once
# (series column, what it is called in an alert)
FIGURES = (("input_wait_s", "input wait"), ("step_s", "step time"))


def _blocks(per_rank: dict[int, tuple[np.ndarray, np.ndarray]], figure: str, step_s: float,
            window: int) -> list[WatchAlert]:
    """:func:`stragglers` over the steps every rank has, ``BLOCK`` at a time; an alert that goes on into
    the next block is one alert."""
    common = None
    for steps, _ in per_rank.values():
        common = steps if common is None else np.intersect1d(common, steps)
    if common is None or len(common) < window:
        return []
    aligned = {r: vals[np.searchsorted(steps, common)] for r, (steps, vals) in per_rank.items()}
    out: list[WatchAlert] = []
    for a in range(0, len(common), BLOCK):
        lo = max(a - (window - 1), 0)
        part = {r: (common[lo:a + BLOCK].tolist(), v[lo:a + BLOCK].tolist()) for r, v in aligned.items()}
        for alert in stragglers(part, figure=figure, step_s=step_s, window=window):
            prev = next((p for p in reversed(out) if p.evidence["rank"].value == alert.evidence["rank"].value), None)
            if prev is not None and alert.first_step <= prev.last_step + 1:
                prev.last_step = max(prev.last_step, alert.last_step)
            else:
                out.append(alert)
    return out


def merge_watch(run_dir: Path, runs: Sequence[Run], step_s: float, window: int = Rules.window) -> WatchSection | None:
    """The parent's ``watch``: rank 0's series and baseline (paths from ``run_dir``), the straggler
    alerts, then every rank's own alerts and captures (each named by its rank); None when no rank
    watched. ``step_s``: the run's clean step (seconds), the floor a straggler's excess must pass."""
    sections = {r: run.watch for r, run in enumerate(runs) if run.watch is not None}
    if not sections:
        return None
    notes: list[str] = []
    series: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {col: {} for col, _ in FIGURES}
    for r, sec in sections.items():
        try:
            rows = read_series([run_dir / f"rank{r}" / p for p in sec.series], ["step", *(c for c, _ in FIGURES)])
        except DataError as exc:
            notes.append(f"rank {r}: its series could not be read for the straggler check ({exc})")
            continue
        order = np.argsort(rows["step"], kind="stable")
        for col, _ in FIGURES:
            steps, vals = rows["step"][order], rows[col][order]
            ok = np.isfinite(vals)
            series[col][r] = (steps[ok], vals[ok])
    alerts: list[WatchAlert] = []
    for col, figure in FIGURES:
        if len(series[col]) >= 2:
            alerts += _blocks(series[col], figure, step_s, window)
    captures: list[WatchCapture] = []
    dropped: dict[str, int] = {}
    for r, sec in sections.items():
        offset = len(alerts)
        for a in sec.alerts:
            evidence = {"rank": Metric(value=float(r), unit="count", source="measured"), **a.evidence}
            alerts.append(a.model_copy(update={"message": f"rank {r}: {a.message}", "evidence": evidence}))
        for c in sec.captures:
            captures.append(c.model_copy(update={"path": f"rank{r}/{c.path}",
                                                 "alert": None if c.alert is None else c.alert + offset}))
        for kind, n in sec.alerts_dropped.items():
            dropped[kind] = dropped.get(kind, 0) + n
        notes += [f"rank {r}: {n}" for n in sec.notes]
    base_rank = 0 if 0 in sections else min(sections)
    base = sections[base_rank]
    notes.insert(0, f"{len(sections)} of {len(runs)} ranks watched their steps, each into rank<r>/watch/; the series "
                    f"here is rank {base_rank}'s; ranks compared by {' and by '.join(f for _, f in FIGURES)}")
    return WatchSection(series=[f"rank{base_rank}/{p}" for p in base.series], steps=base.steps,
                        first_step=base.first_step, last_step=base.last_step, baseline=base.baseline,
                        device_time=base.device_time, alerts=alerts, alerts_dropped=dropped, captures=captures,
                        notes=notes)
