"""The parent's watch section of a torchrun run (analysis/watch_ranks.py), on rank folders written by hand:
the straggler found across comparison blocks as one alert, every rank's alerts and captures named by
rank with their paths and alert indices from the parent's folder."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from lmprof.analysis import watch_ranks
from lmprof.measure.watch.spill import SeriesWriter
from lmprof.record.run import Baseline, Env, Run, WatchAlert, WatchCapture, WatchSection
from lmprof.record.watch import COLUMN_NAMES

N, BEHIND, WAIT_MS = 120, 30, 4.0


def rank_run(folder: Path, rank: int, wait: np.ndarray) -> Run:
    """Rank ``rank``'s run with a watch section whose series has ``wait`` (s) as its input wait."""
    rows = {c: np.full(N, np.nan) for c in COLUMN_NAMES}
    rows["step"] = np.arange(10, 10 + N, dtype=np.int64)
    rows["step_s"] = np.full(N, 0.010)
    rows["input_wait_s"] = wait
    path = SeriesWriter(folder / f"rank{rank}" / "watch").write(rows)
    alert = WatchAlert(kind="input_bound", first_step=12, last_step=20, message=f"its own, rank {rank}")
    cap = WatchCapture(path="watch/capture-1-step30", first_step=30, steps=2, requested_by="alert", alert=0)
    section = WatchSection(series=[path.relative_to(folder / f"rank{rank}").as_posix()], steps=N, first_step=10,
                           last_step=10 + N - 1, baseline=Baseline.from_samples([0.01, 0.0101, 0.0099]),
                           alerts=[alert], captures=[cap], alerts_dropped={"spike": rank + 1})
    env = Env(device="cpu", device_name="x", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1)
    return Run(id=f"rank{rank}", mode="train", created="now", env=env, config={}, watch=section)


def test_the_rank_behind_is_one_alert_across_blocks_and_every_ranks_alerts_are_named(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(watch_ranks, "BLOCK", 40)  # the comparison in three blocks
    rng = np.random.default_rng(0)
    quiet = 1e-4 * (1 + 0.05 * rng.standard_normal(N))
    behind = quiet.copy()
    behind[BEHIND - 10:] += WAIT_MS / 1e3  # rank 1's loader falls behind from step BEHIND
    runs = [rank_run(tmp_path, 0, quiet), rank_run(tmp_path, 1, behind)]
    w = watch_ranks.merge_watch(tmp_path, runs, step_s=0.010)
    assert w is not None and w.series == [f"rank0/{runs[0].watch.series[0]}"] and w.steps == N
    (st,) = [a for a in w.alerts if a.kind == "straggler"]
    assert st.evidence["rank"].value == 1 and "input wait" in st.message
    # stragglers() names the first window whose median is behind: it starts at most half a window early
    assert BEHIND - 8 <= st.first_step <= BEHIND and st.last_step == 10 + N - 1
    assert abs(st.evidence["figure"].value - (WAIT_MS + 0.1)) < 0.02  # ms: the wait behind + the quiet 0.1 ms
    own = [a for a in w.alerts if a.kind == "input_bound"]
    assert [a.message for a in own] == ["rank 0: its own, rank 0", "rank 1: its own, rank 1"]
    assert [a.evidence["rank"].value for a in own] == [0, 1]
    assert [c.path for c in w.captures] == ["rank0/watch/capture-1-step30", "rank1/watch/capture-1-step30"]
    assert [w.alerts[c.alert].message for c in w.captures] == ["rank 0: its own, rank 0", "rank 1: its own, rank 1"]
    assert w.alerts_dropped == {"spike": 3}
    assert w.notes[0].startswith("2 of 2 ranks watched their steps")


def test_equal_ranks_raise_nothing_and_an_unwatched_run_has_no_section(tmp_path: Path):
    rng = np.random.default_rng(1)
    runs = [rank_run(tmp_path, r, 1e-4 * (1 + 0.05 * rng.standard_normal(N))) for r in range(2)]
    w = watch_ranks.merge_watch(tmp_path, runs, step_s=0.010)
    assert w is not None and not [a for a in w.alerts if a.kind == "straggler"]
    for run in runs:
        run.watch = None
    assert watch_ranks.merge_watch(tmp_path, runs, step_s=0.010) is None
