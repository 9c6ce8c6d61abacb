"""Which of a run's figures are not clean medians of steady steps: the marks every view shows with them.

Two things make a timed figure less than the catalogue's definition promises:

``noisy``
    lmprof's noise check marked the run (run.json ``noisy`` / ``noise``, analysis/noise.py): other
    processes kept the cores busy, the steps spread widely, or the profiled window disagrees with
    the clean one.
``first call``
    the script was too short for the clean window, so its timings come from warm-up, profiled or
    very first steps: the run's timing figure has ``basis: "first_call"``
    (pipeline/protocol/finish/assemble.py); a run.json written before that field says so by a note
    that begins with :data:`FIRST_CALL`, still recognised.

Both are about time: they hold for every figure that rests on a measured time (the catalogue's
``rests_on_time``: timings, throughputs, utilisations, energy over the timed window), never for a
peak-memory reading, a parameter count or an estimate. ``compare``, the gate, the report, the
terminal summary and the advice all ask here, so a figure is marked the same way wherever it is shown.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lmprof.record.catalogue import lookup, pick

if TYPE_CHECKING:
    from lmprof.record.run import Run

NOISY = "noisy"
FIRST_CALL = "first call"
# Units of a figure the catalogue does not know (a newer lmprof's) that are themselves a time or a rate.
_TIMED_UNITS = ("ns", "us", "µs", "ms", "s", "tokens/s")


def rests_on_time(key: str, unit: str = "") -> bool:
    """Whether figure ``key`` is a measured time or computed from one (the catalogue says; else its unit)."""
    spec = lookup(key)
    if spec is not None:
        return spec.rests_on_time
    return unit in _TIMED_UNITS


def _timing_key(run: "Run") -> str:
    return pick("timing", run.mode).name


def first_call_note(run: "Run") -> str | None:
    """The note of a run whose timings are first-call figures (no clean step was timed), else None."""
    m = run.metric(_timing_key(run))
    if m is None:
        return None
    note = m.note or ""
    if m.basis is not None:  # the record says what the figure rests on
        return (note or f"{FIRST_CALL}: no clean step was timed") if m.basis == "first_call" else None
    return note if note.startswith(FIRST_CALL) else None  # a run.json from before the field: its note says


def marks(run: "Run", key: str, unit: str = "") -> tuple[str, ...]:
    """The marks of figure ``key`` in ``run``: ``("noisy",)``, ``("first call",)``, both, or none. A figure
    the run has as n/a rests on no timing: it has none (its reason says why it is missing)."""
    m = run.metrics.get(key)
    if not rests_on_time(key, unit) or (m is not None and m.value is None):
        return ()
    found = []
    if first_call_note(run) is not None:
        found.append(FIRST_CALL)
    if run.noisy:
        found.append(NOISY)
    return tuple(found)


def run_marks(run: "Run") -> list[str]:
    """One sentence per mark the run's timed figures carry, with its reason (empty: clean timings)."""
    out = []
    note = first_call_note(run)
    if note is not None:
        out.append(f"{FIRST_CALL}: {note.removeprefix(FIRST_CALL).lstrip(': ')}")
    if run.noisy:
        out.append(f"{NOISY}: {(run.noise or ['marked noisy, no reason recorded'])[0]}")
    return out


def tag(marks_: Sequence[str]) -> str:
    """' [noisy]', ' [first call, noisy]' or '' — the suffix a value is printed with (ASCII only)."""
    return f" [{', '.join(marks_)}]" if marks_ else ""
