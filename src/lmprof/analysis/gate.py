"""A noise-aware performance gate: does run B regress beyond a threshold against baseline run A?

A condition reads ``METRIC>+X%`` (fail when the figure grows by more than X %: times, memory,
energy) or ``METRIC<-X%`` (fail when it shrinks by more than X %: throughputs, utilisations); the
sign is required in both (:func:`parse_condition`). Each condition gets one of three verdicts,
decided from the two runs' recorded medians and their p10-p90 spreads (a figure recorded without a
spread, such as a peak-memory reading, is one exact value):

``fail``
    the regression exceeds the threshold even between the *near ends* of the two spreads: for
    ``>``, B's p10 against A's p90 (for ``<``, B's p90 against A's p10). The change is beyond both
    runs' measured spread. When a run is marked noisy the verdict still stands but says so: a busy
    machine can slow every step of a window alike without widening its spread.
``pass``
    the change of the medians is within the threshold and the figure is a clean one in both runs.
``undecided``
    everything else: the medians cross the threshold but the spreads overlap enough that the
    change could be noise; a timed figure of a run marked noisy (run.json ``noisy``,
    analysis/noise.py) that is not beyond its spread, or that has no spread to be beyond; a timed
    figure that is a first call in either run (no clean step was timed: warm-up costs included,
    analysis/marks.py), whatever the change; the figure n/a in a run.

Noise and first calls are about time: they hold back only figures that rest on a measured time
(the catalogue's ``rests_on_time``), never a one-off reading such as peak memory. Runs whose
environments differ in what executes the step are refused before any rule is checked, as
``compare`` refuses them (analysis/compare.py, ``--allow-env-diff``).

The overall verdict is ``fail`` when any condition fails, else ``undecided`` when any is
undecided, else ``pass``. Exit codes (the CLI's): 0 pass, 1 fail, 3 undecided, 2 bad input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Sequence

from lmprof.errors import ConfigError
from lmprof.record.catalogue import energy_key, memory_key

if TYPE_CHECKING:  # kept out of the import: `lmprof compare --help` reads FORM without pydantic
    from lmprof.record.run import Metric, Run

Verdict = Literal["pass", "fail", "undecided"]
EXIT_CODES: dict[Verdict, int] = {"pass": 0, "fail": 1, "undecided": 3}

# Names a CI author reaches for first, mapped to run.json's figure names; any figure name also works.
ALIASES = {
    "peak_memory": memory_key("peak"),
    "memory": memory_key("peak"),
    "energy": energy_key("total"),
    "energy_per_token": energy_key("per_token"),
}

_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*([<>])\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*$")
#: The rule's form, as --help, the error messages and docs/ci-gate.md give it (tests/test_gate_docs.py
#: runs the docs' examples against this parser).
FORM = "METRIC>+X% (fail when it grows by more than X%) or METRIC<-X% (fail when it drops by more than X%)"
EXAMPLES = ("step_time>+5%", "tokens_per_s<-5%")


@dataclass(frozen=True)
class Condition:
    """One ``--fail-on`` rule: ``metric`` (run.json name) grows (``>``) or shrinks (``<``) by > ``pct`` %."""

    text: str
    metric: str
    op: Literal[">", "<"]
    pct: float


@dataclass(frozen=True)
class Check:
    """The verdict of one condition, with the figures it was decided from."""

    condition: Condition
    verdict: Verdict
    unit: str
    base: float | None
    new: float | None
    change_pct: float | None
    # The change between the near ends of the two spreads (the smallest regression they allow).
    near_change_pct: float | None
    base_spread: tuple[float, float] | None
    new_spread: tuple[float, float] | None
    reason: str
    # What the verdict rests on besides clean figures: "A noisy", "B first call" (analysis/marks.py).
    marks: tuple[str, ...] = ()


@dataclass(frozen=True)
class GateResult:
    """All conditions' checks and the overall verdict."""

    base_id: str
    new_id: str
    checks: tuple[Check, ...]
    noise: tuple[str, ...]
    # "<run id>: <note>" for a run whose timings are first-call figures.
    first_call: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        verdicts = {c.verdict for c in self.checks}
        return "fail" if "fail" in verdicts else "undecided" if "undecided" in verdicts else "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def parse_condition(text: str) -> Condition:
    """Parse ``step_time>+5%`` / ``tokens_per_s<-3%``; raise :class:`ConfigError` with the expected form.

    The sign is required and says the direction in both forms alike (``>+``: a growth, ``<-``: a
    drop): ``step_time>5%`` and ``tokens_per_s<5%`` are refused, as are ``>-X%`` and ``<+X%``. A rule
    reads as the change it fails on, so no spelling of it can mean the opposite of what it says.
    """
    m = _EXPR.match(text)
    hint = f"expected {FORM}, e.g. {' or '.join(repr(e) for e in EXAMPLES)}"
    if not m:
        raise ConfigError(f"--fail-on {text!r}: {hint}")
    name, op, sign, number = m.groups()
    if sign != ("+" if op == ">" else "-"):
        what = "the sign is required" if not sign else f"'{op}{sign}' mixes two directions"
        raise ConfigError(f"--fail-on {text!r}: {what}: '{name}>+{number}%' fails when {name} grows by more than "
                          f"{number}%, '{name}<-{number}%' when it drops by more than {number}%")
    return Condition(text=text.strip(), metric=ALIASES.get(name, name), op=op,  # type: ignore[arg-type]
                     pct=float(number))

def _ends(m: "Metric") -> tuple[float, float]:
    """(p10, p90) of a figure; a figure without a recorded spread is one exact value."""
    assert m.value is not None
    lo = m.p10 if m.p10 is not None else m.value
    hi = m.p90 if m.p90 is not None else m.value
    return (min(lo, m.value), max(hi, m.value))


def _has_spread(m: "Metric") -> bool:
    return m.p10 is not None and m.p90 is not None


def _pct(new: float, base: float) -> float:
    return 100.0 * (new / base - 1.0)


def check(base: "Run", new: "Run", cond: Condition) -> Check:
    """Decide one condition for ``new`` against ``base`` (see the module's docstring for the rule)."""
    from lmprof.analysis.marks import FIRST_CALL, NOISY, first_call_note, marks

    ma, mb = base.metric(cond.metric), new.metric(cond.metric)
    some = ma or mb
    unit = some.unit if some is not None else ""
    labelled = (("A", base), ("B", new))
    found = tuple(f"{label} {m}" for label, run in labelled for m in marks(run, cond.metric, unit))

    def verdict(v: Verdict, reason: str, **kw: object) -> Check:
        return Check(cond, v, unit, ma.value if ma else None, mb.value if mb else None, kw.get("change"),  # type: ignore[arg-type]
                     kw.get("near"), kw.get("sa"), kw.get("sb"), reason, found)  # type: ignore[arg-type]

    for run, m in ((base, ma), (new, mb)):
        if m is None:
            return verdict("undecided", f"{run.id} has no figure {cond.metric}")
        if m.value is None:
            return verdict("undecided", f"{cond.metric} is n/a in {run.id}: {m.note or 'no reason recorded'}")
    assert ma is not None and mb is not None and ma.value is not None and mb.value is not None
    if ma.value == 0:
        return verdict("undecided", f"{cond.metric} is 0 in {base.id}: no relative change")
    sa, sb = _ends(ma), _ends(mb)
    change = _pct(mb.value, ma.value)
    if cond.op == ">":
        near = _pct(sb[0], sa[1]) if sa[1] else change
        beyond, within = near > cond.pct, change <= cond.pct
    else:
        near = _pct(sb[1], sa[0]) if sa[0] else change
        beyond, within = near < -cond.pct, change >= -cond.pct
    kw = {"change": change, "near": near, "sa": sa, "sb": sb}
    first = [(label, run) for label, run in labelled if f"{label} {FIRST_CALL}" in found]
    if first:
        why = "; ".join(f"{label} ({run.id}): {first_call_note(run)}" for label, run in first)
        return verdict("undecided", f"cannot decide: {cond.metric} {change:+.1f}% rests on a first-call figure, "
                       f"not a clean timing ({why}); give the script enough steps for the clean window", **kw)
    noisy = [(label, run) for label, run in labelled if f"{label} {NOISY}" in found]
    noise = "; ".join(f"{label} ({run.id}): {(run.noise or ['marked noisy'])[0]}" for label, run in noisy)
    if beyond and noisy and not (_has_spread(ma) and _has_spread(mb)):
        return verdict("undecided", f"cannot decide: {cond.metric} changed {change:+.1f}% but it has no recorded "
                       f"spread and {'both runs are' if len(noisy) == 2 else 'a run is'} marked noisy ({noise})", **kw)
    if beyond:
        reason = (f"{cond.metric} changed {change:+.1f}% (at least {near:+.1f}% between the spreads' near ends), "
                  f"beyond {cond.op}{'+' if cond.op == '>' else '-'}{cond.pct:g}%")
        if noisy:
            reason += (f"; warning: {'both runs are' if len(noisy) == 2 else 'a run is'} marked noisy ({noise}): "
                       "a busy machine can slow a whole window alike without widening its spread; confirm on an "
                       "idle machine")
        return verdict("fail", reason, **kw)
    if noisy:
        return verdict("undecided", f"cannot decide: {'both runs are' if len(noisy) == 2 else 'a run is'} too noisy "
                       f"({noise})", **kw)
    if within:
        return verdict("pass", f"{cond.metric} changed {change:+.1f}%, within {cond.text.split(cond.op, 1)[1].strip()}",
                       **kw)
    return verdict("undecided", f"cannot decide: {cond.metric} changed {change:+.1f}% but the runs' p10-p90 spreads "
                   f"overlap (only {near:+.1f}% between their near ends)", **kw)


def gate(base: "Run", new: "Run", conditions: Sequence[Condition], *, force: bool = False,
         allow_env_diff: bool = False) -> GateResult:
    """Check every condition for ``new`` against ``base``; refuses incomparable runs like compare does
    (different models or modes unless ``force``, environments that differ in what executes the step
    unless ``allow_env_diff``).

    A condition whose figure neither run records is a mistake in the rule, not a verdict: it raises
    :class:`ConfigError` naming the figures the runs do have.
    """
    from lmprof.analysis.compare import check_comparable
    from lmprof.analysis.marks import first_call_note

    check_comparable([base, new], allow_different_models=force, allow_mixed_modes=force,
                     allow_env_diff=allow_env_diff)
    for cond in conditions:
        if cond.metric not in base.metrics and cond.metric not in new.metrics:
            known = ", ".join(sorted(set(base.metrics) | set(new.metrics))[:30])
            raise ConfigError(f"--fail-on {cond.text!r}: neither run has a figure {cond.metric!r} (they have: {known})")
    noise = tuple(f"{r.id}: {n}" for r in (base, new) if r.noisy for n in (r.noise or ["marked noisy"]))
    first = tuple(f"{r.id}: {first_call_note(r)}" for r in (base, new) if first_call_note(r) is not None)
    return GateResult(base.id, new.id, tuple(check(base, new, c) for c in conditions), noise, first)
