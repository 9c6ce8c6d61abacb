"""How many steps each phase of the measurement protocol runs when none are asked for.

The one table of defaults: ``lmprof train`` / ``infer`` / ``run``, ``lmprof.profile()``, the Trainer
and Lightning callbacks and the Python API read it, their ``--help`` prints it, and docs/user-code.md
states it (tests/test_protocol_defaults.py holds them together). Inference profiles 3 generations,
as training profiles 3 steps: per-block medians, and a spread to show.
"""
from __future__ import annotations

from typing import NamedTuple


class Counts(NamedTuple):
    """Steps (training) or generations (inference) of each phase."""

    warmup: int
    steps: int  # the clean window
    profile_steps: int


DEFAULT_COUNTS: dict[str, Counts] = {"train": Counts(warmup=3, steps=10, profile_steps=3),
                                     "infer": Counts(warmup=1, steps=5, profile_steps=3)}


def default_help(mode: str, field: str) -> str:
    """``[default: N]`` for a --help line, from the table."""
    return f"[default: {getattr(DEFAULT_COUNTS[mode], field)}]"


def counts_for(mode: str, warmup: int | None = None, steps: int | None = None,
               profile_steps: int | None = None) -> Counts:
    """The counts asked for, the table's where one is None."""
    w, s, p = DEFAULT_COUNTS[mode]
    return Counts(w if warmup is None else warmup, s if steps is None else steps,
                  p if profile_steps is None else profile_steps)


class CaptureLimits(NamedTuple):
    """How often the whole-run watch may profile a window by itself (analysis/watch_capture.py)."""

    max_captures: int  # captured windows in a run, at most
    min_gap_steps: int  # steps between the starts of two captures that alerts asked for, at least


# The one table of the watch's capture limits: lmprof run --watch-*, lmprof.profile(), the callbacks
# and the limiter itself read it.
WATCH_LIMITS = CaptureLimits(max_captures=3, min_gap_steps=1000)
