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


# Beyond this no clock could finish a run; below it, lmprof.pipeline.budget estimates the duration.
MOST_STEPS = 2**62


def fewest(field: str, *, zero_steps: bool) -> int:
    """The fewest steps of a phase the protocol runs. No warm-up is a choice; no profiled step is not.
    ``zero_steps``: the door may run no clean window and time from the profiled steps, marked rough
    (``lmprof run``, ``lmprof.profile()``, a script sweep); the built-in loops always run one."""
    return 0 if field == "warmup" or (zero_steps and field == "steps") else 1


def count_error(field: str, value: int, *, zero_steps: bool) -> str | None:
    """Why ``value`` cannot be the count of phase ``field`` (``warmup``, ``steps``, ``profile_steps``);
    None when it can. The one rule every door's check reads."""
    low = fewest(field, zero_steps=zero_steps)
    if value < low:
        return f"must be at least {low}, got {value if value > -10**30 else 'a huge negative number'}"
    if value > MOST_STEPS:
        return f"must be at most {MOST_STEPS:,}, got a {len(str(value))}-digit number"
    return None


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
