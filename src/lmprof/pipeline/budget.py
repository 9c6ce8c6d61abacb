"""Refuse a run that would take longer than anyone means to wait (``--steps 10**12``), unless forced.

Short runs pay nothing: only when warm-up + timed + profiled steps exceed :data:`FREE_STEPS` are two
steps timed to estimate the whole run, and a run estimated past :data:`MAX_SECONDS` is refused with
the estimate and how to go on (``--force``).
"""
from __future__ import annotations

from typing import Callable

from lmprof.errors import ConfigError
from lmprof.measure.timing import time_calls

FREE_STEPS = 1_000
MAX_SECONDS = 3600.0


def human_duration(seconds: float) -> str:
    """A long duration in the largest unit that keeps it readable."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.1f} s"


def _short(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def check_duration(fn: Callable[[], object], total_steps: int, sync: Callable[[], None], *, force: bool,
                   what: str = "steps") -> None:
    """Raise ConfigError when ``total_steps`` calls of ``fn`` would take more than MAX_SECONDS.

    The estimate is the faster of two timed calls (the first may include one-off set-up costs), so
    it errs towards letting a run go ahead.
    """
    if force or total_steps <= FREE_STEPS:
        return
    one = min(time_calls(fn, 2, sync))
    estimate = one * total_steps
    if estimate > MAX_SECONDS:
        raise ConfigError(
            f"{total_steps:,} {what} would take about {human_duration(estimate)} (one takes {_short(one)} here), more than the {MAX_SECONDS / 3600:g} hour lmprof runs without asking: use fewer --steps/"
            f"--warmup, or pass --force")
