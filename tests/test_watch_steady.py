"""A steady loop watched for 500 steps raises no alert: the whole-run watch, wired into the protocol,
adds nothing of its own that its detectors would take for a change (the profiler's teardown, its own
work at the boundaries, spilling, the forward hook).

Marked stopwatch: on a shared machine another process taking the core for a few milliseconds is a
real spike, and for a few hundred a real drift, which the detectors are right to name; whether the
watch itself raises nothing can only be judged on a quiet machine, so this runs in make test's
stopwatch stage, alone. Even there a VM stalls a step now and then: a spike on steps where the watch
did none of its periodic work (a feed, a spill, a memory read), nor in the step before, is the
machine's and is let pass; any other alert runs the loop again, and fails the test when the second run
raises one of the same kind (a VM slowed for a few dozen steps drifts a median just as the watch's own
work would; only the watch's comes back). The detectors' own noise rules are tested on synthetic series in
tests/test_watch_detect.py (test_500_steady_steps_with_realistic_jitter_raise_nothing).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import lmprof
from lmprof.record.run import Run, WatchAlert
from lmprof.record.watch import read_series

WINDOW, WATCHED = 3 + 10 + 1 + 3, 500


@pytest.mark.stopwatch
def test_500_steady_watched_steps_raise_no_alert(tmp_path: Path) -> None:
    first = _watched(tmp_path / "1")
    if first:
        # A VM slowed for a few dozen steps drifts the median as the watch would (1 run in 6 of make test
        # here: 1.45x for 16 steps); the watch's own doing comes back in a second run, the machine's not.
        second = _watched(tmp_path / "2")
        assert not {kind for kind, _, _ in first} & {kind for kind, _, _ in second}, (first, second)


def _watched(out: Path) -> list[tuple[str, int, str]]:
    """The alerts of 500 steady watched steps that are not the machine's (:func:`_the_machines`)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 128)
    with lmprof.profile(model, out=out, report=False, verbose=False, watch=True) as prof:
        for _ in range(WINDOW + WATCHED):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step(loss=loss)
    w = Run.load(prof.folder).watch
    assert w is not None
    # the first step after the profiler is left out, and so are a capture's steps (an alert on this machine's
    # noise asks for one): its profiler warm-up step, its profiled steps and the settling step after it
    captured = sum(c.steps + 2 for c in w.captures)
    assert w.steps == WATCHED - 1 - captured, (w.steps, [(c.first_step, c.steps) for c in w.captures])
    s = read_series([prof.folder / p for p in w.series])
    assert np.isfinite(s["loss"]).all() and np.isfinite(s["rss_B"]).any()
    return [(a.kind, a.first_step, a.message) for a in w.alerts if not _the_machines(a, s)]


def _the_machines(alert: WatchAlert, s: dict[str, np.ndarray]) -> bool:
    """A spike on steps where the watch did nothing beyond its every-step work, nor in the step before
    (no feed or spill billed to ``own_s``, no memory read): the machine's, which the detector is right
    to name (a VM's 0.8 ms hiccup on a 0.9 ms step, 1 run in 5 of make test). Anything else, or a spike
    on or just after the watch's own periodic work, is the watch's."""
    if alert.kind != "spike":
        return False
    rows = np.flatnonzero((s["step"] >= alert.first_step - 1) & (s["step"] <= alert.last_step))
    quiet = (np.nan_to_num(s["own_s"][rows]) < 50e-6) & ~np.isfinite(s["rss_B"][rows])
    return bool(len(rows)) and bool(quiet.all())
