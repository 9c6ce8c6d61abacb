"""The gate's verdicts and a comparison's headline figures as Markdown (a CI job summary, a PR comment)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lmprof.analysis.marks import tag
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


def _of(c: "Check", label: str) -> list[str]:
    return [m.split(" ", 1)[1] for m in c.marks if m.startswith(f"{label} ")]


def check_rows(checks: Sequence["Check"]) -> list[list[str]]:
    """One row per condition: rule, A, A's p10-p90, B, B's p10-p90, change, verdict, why. A value that is
    a noisy run's or a first call's carries that mark; the reason of a verdict resting on one says so."""
    rows = []
    for c in checks:
        change = "" if c.change_pct is None else f"{c.change_pct:+.1f}%"
        rows.append([c.condition.text, _val(c.base, c.unit) + tag(_of(c, "A")), _spread(c.base_spread, c.unit),
                     _val(c.new, c.unit) + tag(_of(c, "B")), _spread(c.new_spread, c.unit), change,
                     _ICON[c.verdict], c.reason])
    return rows


def gate_notes(result: "GateResult") -> list[str]:
    """One line per run mark the gate saw: 'noisy: <run>: <reason>', 'first call: <run>: <note>'."""
    return [f"noisy: {n}" for n in result.noise] + [f"first call: {n}" for n in result.first_call]


def env_lines(comparison: "Comparison") -> list[str]:
    """Where the runs' environments and configurations differ, blocking differences first (plain text)."""
    from lmprof.analysis.compare import describe_env_difference

    if not comparison.env:
        return ["environment: the same in every run (every fact run.json records under env)"]
    out = ["environment and configuration differences:"]
    for d in comparison.env:
        kind = ("blocking (compared only with --allow-env-diff)" if d.blocking
                else "configuration" if d.key.startswith("config.") else "informational")
        out.append(f"  {kind}: {describe_env_difference(d)}")
    return out


CHECK_HEADER = ["rule", "A", "A p10 – p90", "B", "B p10 – p90", "change", "verdict", "why"]


def markdown(comparison: "Comparison", result: "GateResult | None", folders: Sequence[str]) -> str:
    """A Markdown summary: the gate's verdict and rules (when there are any), then the headline figures."""
    lines: list[str] = []
    if result is not None:
        lines += [f"## lmprof performance gate: {_ICON[result.verdict]}", ""]
    else:
        lines += ["## lmprof compare", ""]
    for i, (label, rid, desc, folder) in enumerate(zip(comparison.labels, comparison.run_ids,
                                                       comparison.descriptions, folders)):
        lines.append(f"- **{label}** `{_cell(rid)}` ({_cell(desc)}) — `{_cell(folder)}`")
        for mark in comparison.run_marks[i] if comparison.run_marks else ():
            kind, why = mark.split(":", 1)
            lines.append(f"  - **{_cell(kind)}**: {_cell(why)}")
    env = env_lines(comparison)
    lines.append(f"- {_cell(env[0])}")
    lines += [f"  - {_cell(line.strip())}" for line in env[1:]]
    for w in comparison.warnings:
        lines.append(f"- warning: {_cell(w)}")
    if result is not None:
        lines += ["", _table(CHECK_HEADER, check_rows(result.checks))]
    rows = []
    for m in comparison.group("headline"):
        if all(v is None for v in m.values):
            continue
        last = len(m.values) - 1
        change = "" if m.ratios[-1] is None else f"{100 * (m.ratios[-1] - 1):+.1f}%" + tag(m.ratio_marks(last))
        marks = m.marks or tuple(() for _ in m.values)
        rows.append([m.key, *[_val(v, m.unit) + ("" if v is None else tag(k)) for v, k in zip(m.values, marks)],
                     change])
    if rows:
        lines += ["", "### Figures", "", _table(["figure", *comparison.labels, f"{comparison.labels[-1]} vs A"], rows)]
    lines += ["", "Rule: a change fails only when it exceeds the threshold even between the near ends of both "
              "runs' p10–p90 spreads (a noisy run's failure says so); it passes when the medians' change is within "
              "the threshold and the figure is clean in both runs; a figure that is noisy and within its spread, or "
              "a first call in either run, cannot be decided. [noisy] and [first call] mark figures that rest on "
              "such timings."]
    return "\n".join(lines) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
