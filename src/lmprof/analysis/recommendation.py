"""What a piece of advice is: a :class:`Recommendation` and the :class:`Evidence` it rests on, the type
of a rule, and the figure every step-share rule reads (:func:`block_share`). The rules themselves are in
:mod:`lmprof.analysis.advice` and :mod:`lmprof.analysis.step_parts_advice`. Pure: no I/O, no torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from lmprof.record.run import Run

Comparison = Literal[">", ">=", "<", "<=", "|x| >", "present"]


@dataclass(frozen=True)
class Evidence:
    """One recorded figure a rule relied on, and the threshold it was held against."""

    key: str
    value: float
    unit: str
    threshold: float | None
    comparison: Comparison

    def describe(self) -> str:
        """'profiler_overhead = 45.0 % (threshold |x| > 30 %)'."""
        limit = "" if self.threshold is None else f" (threshold {self.comparison} {self.threshold:g} {self.unit})"
        return f"{self.key} = {figure_text(self.value)} {self.unit}{limit}"


@dataclass(frozen=True)
class Recommendation:
    """What to try, why, and the evidence that made the rule fire."""

    rule: str
    title: str
    why: str
    actions: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (evidence as a list of dicts)."""
        return asdict(self)


def figure_text(x: float) -> str:
    """A figure in a recommendation: three significant digits; whole, with separators, from 100 to a million."""
    return f"{x:,.0f}" if 100 <= abs(x) < 1e6 else f"{x:.3g}"


def block_share(run: Run, names: Sequence[str], phase: str | None = None) -> float | None:
    """Summed share (%) of the profiled step held by blocks ``names``; None if none is recorded."""
    rows = [b for b in run.blocks if b.name in names and (phase is None or b.phase == phase)]
    return sum(b.pct for b in rows) if rows else None


Rule = Callable[[Run, Mapping[str, float]], "Recommendation | None"]
