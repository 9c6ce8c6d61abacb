"""A noise-aware performance gate: does run B regress beyond a threshold against baseline run A?

A condition reads ``METRIC>+X%`` (fail when the figure grows by more than X %: times, memory,
energy) or ``METRIC<-X%`` (fail when it shrinks by more than X %: throughputs, utilisations).
Each condition gets one of three verdicts, decided from the two runs' recorded medians and their
p10-p90 spreads (a figure recorded without a spread, such as a peak-memory reading, is one exact
value):

``fail``
    the regression exceeds the threshold even between the *near ends* of the two spreads: for
    ``>``, B's p10 against A's p90 (for ``<``, B's p90 against A's p10). The change is beyond both
    runs' measured spread, so noise cannot explain it.
``pass``
    the change of the medians is within the threshold and neither run is marked noisy (the noise
    verdict is about timing: it applies to figures recorded with a spread, not to one-off readings
    such as peak memory).
``undecided``
    everything else: the medians cross the threshold but the spreads overlap enough that the
    change could be noise, a run is marked noisy by lmprof's own noise check (run.json ``noisy``,
    analysis/noise.py) and the change is not beyond its spread, or the figure is n/a in a run.

The overall verdict is ``fail`` when any condition fails, else ``undecided`` when any is
undecided, else ``pass``. Exit codes (the CLI's): 0 pass, 1 fail, 3 undecided, 2 bad input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Sequence

from lmprof.analysis.compare import check_comparable
from lmprof.errors import ConfigError
from lmprof.record.run import Metric, Run

Verdict = Literal["pass", "fail", "undecided"]
EXIT_CODES: dict[Verdict, int] = {"pass": 0, "fail": 1, "undecided": 3}

# Names a CI author reaches for first, mapped to run.json's figure names; any figure name also works.
ALIASES = {
    "peak_memory": "memory.peak",
    "memory": "memory.peak",
    "energy": "energy.total",
    "energy_per_token": "energy.per_token",
}

_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*([<>])\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*$")


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


@dataclass(frozen=True)
class GateResult:
    """All conditions' checks and the overall verdict."""

    base_id: str
    new_id: str
    checks: tuple[Check, ...]
    noise: tuple[str, ...]

    @property
    def verdict(self) -> Verdict:
        verdicts = {c.verdict for c in self.checks}
        return "fail" if "fail" in verdicts else "undecided" if "undecided" in verdicts else "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def parse_condition(text: str) -> Condition:
    """Parse ``step_time>+5%`` / ``tokens_per_s<-3%``; raise :class:`ConfigError` with the expected form."""
    m = _EXPR.match(text)
    hint = "expected METRIC>+X% or METRIC<-X%, e.g. 'step_time>+5%' or 'tokens_per_s<-5%'"
    if not m:
        raise ConfigError(f"--fail-on {text!r}: {hint}")
    name, op, sign, number = m.groups()
    if (op == ">" and sign == "-") or (op == "<" and sign != "-"):
        raise ConfigError(f"--fail-on {text!r}: '>' takes a growth (+X%), '<' a drop (-X%); {hint}")
    return Condition(text=text.strip(), metric=ALIASES.get(name, name), op=op,  # type: ignore[arg-type]
                     pct=float(number))


def _ends(m: Metric) -> tuple[float, float]:
    """(p10, p90) of a figure; a figure without a recorded spread is one exact value."""
    assert m.value is not None
    lo = m.p10 if m.p10 is not None else m.value
    hi = m.p90 if m.p90 is not None else m.value
    return (min(lo, m.value), max(hi, m.value))


def _has_spread(m: Metric) -> bool:
    return m.p10 is not None and m.p90 is not None


def _pct(new: float, base: float) -> float:
    return 100.0 * (new / base - 1.0)


def check(base: Run, new: Run, cond: Condition) -> Check:
    """Decide one condition for ``new`` against ``base`` (see the module's docstring for the rule)."""
    ma, mb = base.metric(cond.metric), new.metric(cond.metric)
    some = ma or mb
    unit = some.unit if some is not None else ""

    def undecided(reason: str, **kw: object) -> Check:
        return Check(cond, "undecided", unit, ma.value if ma else None, mb.value if mb else None,
                     kw.get("change"), kw.get("near"), kw.get("sa"), kw.get("sb"), reason)  # type: ignore[arg-type]

    for run, m in ((base, ma), (new, mb)):
        if m is None:
            return undecided(f"{run.id} has no figure {cond.metric}")
        if m.value is None:
            return undecided(f"{cond.metric} is n/a in {run.id}: {m.note or 'no reason recorded'}")
    assert ma is not None and mb is not None and ma.value is not None and mb.value is not None
    if ma.value == 0:
        return undecided(f"{cond.metric} is 0 in {base.id}: no relative change")
    sa, sb = _ends(ma), _ends(mb)
    change = _pct(mb.value, ma.value)
    if cond.op == ">":
        near = _pct(sb[0], sa[1]) if sa[1] else change
        beyond, within = near > cond.pct, change <= cond.pct
    else:
        near = _pct(sb[1], sa[0]) if sa[0] else change
        beyond, within = near < -cond.pct, change >= -cond.pct
    kw = {"change": change, "near": near, "sa": sa, "sb": sb}
    if beyond:
        return Check(cond, "fail", unit, ma.value, mb.value, change, near, sa, sb,
                     f"{cond.metric} changed {change:+.1f}% (at least {near:+.1f}% between the spreads' near ends), "
                     f"beyond {cond.op}{'+' if cond.op == '>' else '-'}{cond.pct:g}%")
    # The noise verdict is about timing: it holds back figures measured over repeats (with a spread),
    # not one-off readings such as a peak-memory counter.
    noisy = [r for r in (base, new) if r.noisy] if _has_spread(ma) or _has_spread(mb) else []
    if noisy:
        why = "; ".join(f"{r.id}: {(r.noise or ['marked noisy'])[0]}" for r in noisy)
        return undecided(f"cannot decide: {'both runs are' if len(noisy) == 2 else 'a run is'} too noisy ({why})",
                         **kw)
    if within:
        return Check(cond, "pass", unit, ma.value, mb.value, change, near, sa, sb,
                     f"{cond.metric} changed {change:+.1f}%, within {cond.text.split(cond.op, 1)[1].strip()}")
    return undecided(f"cannot decide: {cond.metric} changed {change:+.1f}% but the runs' p10-p90 spreads overlap "
                     f"(only {near:+.1f}% between their near ends)", **kw)


def gate(base: Run, new: Run, conditions: Sequence[Condition], *, force: bool = False) -> GateResult:
    """Check every condition for ``new`` against ``base``; refuses incomparable runs like compare does.

    A condition whose figure neither run records is a mistake in the rule, not a verdict: it raises
    :class:`ConfigError` naming the figures the runs do have.
    """
    check_comparable([base, new], allow_different_models=force, allow_mixed_modes=force)
    for cond in conditions:
        if cond.metric not in base.metrics and cond.metric not in new.metrics:
            known = ", ".join(sorted(set(base.metrics) | set(new.metrics))[:30])
            raise ConfigError(f"--fail-on {cond.text!r}: neither run has a figure {cond.metric!r} (they have: {known})")
    noise = tuple(f"{r.id}: {n}" for r in (base, new) if r.noisy for n in (r.noise or ["marked noisy"]))
    return GateResult(base.id, new.id, tuple(check(base, new, c) for c in conditions), noise)
