"""The gate's verdicts and a comparison's headline figures as Markdown (a CI job summary, a PR comment)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lmprof.show.format import number

if TYPE_CHECKING:
    from lmprof.analysis.compare import Comparison
    from lmprof.analysis.gate import Check, GateResult

_ICON = {"pass": "✅ pass", "fail": "❌ fail", "undecided": "⚠️ cannot decide"}


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, no line breaks."""
    return " ".join(text.replace("|", "\\|").split())


def _val(v: float | None, unit: str) -> str:
    return "n/a" if v is None else number(v, unit)


def _spread(s: tuple[float, float] | None, unit: str) -> str:
    return "" if s is None or s[0] == s[1] else f"{number(s[0], unit)} – {number(s[1], unit)}"


def check_rows(checks: Sequence["Check"]) -> list[list[str]]:
    """One row per condition: rule, A, A's p10-p90, B, B's p10-p90, change, verdict, why."""
    rows = []
    for c in checks:
        change = "" if c.change_pct is None else f"{c.change_pct:+.1f}%"
        rows.append([c.condition.text, _val(c.base, c.unit), _spread(c.base_spread, c.unit), _val(c.new, c.unit),
                     _spread(c.new_spread, c.unit), change, _ICON[c.verdict], c.reason])
    return rows


CHECK_HEADER = ["rule", "A", "A p10 – p90", "B", "B p10 – p90", "change", "verdict", "why"]


def markdown(comparison: "Comparison", result: "GateResult | None", folders: Sequence[str]) -> str:
    """A Markdown summary: the gate's verdict and rules (when there are any), then the headline figures."""
    lines: list[str] = []
    if result is not None:
        lines += [f"## lmprof performance gate: {_ICON[result.verdict]}", ""]
    else:
        lines += ["## lmprof compare", ""]
    for label, rid, desc, folder in zip(comparison.labels, comparison.run_ids, comparison.descriptions, folders):
        lines.append(f"- **{label}** `{_cell(rid)}` ({_cell(desc)}) — `{_cell(folder)}`")
    for w in comparison.warnings:
        lines.append(f"- warning: {_cell(w)}")
    if result is not None:
        for n in result.noise:
            lines.append(f"- noisy: {_cell(n)}")
        lines += ["", _table(CHECK_HEADER, check_rows(result.checks))]
    rows = []
    for m in comparison.group("headline"):
        if all(v is None for v in m.values):
            continue
        change = "" if m.ratios[-1] is None else f"{100 * (m.ratios[-1] - 1):+.1f}%"
        rows.append([m.key, *[_val(v, m.unit) for v in m.values], change])
    if rows:
        lines += ["", "### Figures", "", _table(["figure", *comparison.labels, f"{comparison.labels[-1]} vs A"], rows)]
    lines += ["", "Rule: a change fails only when it exceeds the threshold even between the near ends of both "
              "runs' p10–p90 spreads; it passes when the medians' change is within the threshold and no run is "
              "marked noisy; otherwise lmprof cannot decide."]
    return "\n".join(lines) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
