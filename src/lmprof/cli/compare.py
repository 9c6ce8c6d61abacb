"""``lmprof compare``: two or more run folders side by side, with ratios against the first."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Sequence

import typer

from lmprof.analysis.gate import FORM
from lmprof.cli.app import app
from lmprof.cli.common import console

from rich.markup import escape
from rich.text import Text

if TYPE_CHECKING:
    from rich.table import Table

    from lmprof.analysis.compare import BlockRow, Comparison, CountRow, Group, MetricRow
    from lmprof.analysis.gate import GateResult

# Ratios within this distance of 1 are shown without colour: run-to-run noise, not a change.
_NEUTRAL_BAND = 0.03
_TOP_COUNT_ROWS = 25


@app.command()
def compare(
    runs: List[Path] = typer.Argument(..., help="Run folders; the first is the baseline A"),
    force: bool = typer.Option(False, "--force", help="Compare runs of different models, or train with infer"),
    allow_env_diff: bool = typer.Option(False, "--allow-env-diff", help="Compare runs whose environments differ in "
                                        "what executes the step (device, torch, CUDA; CPU model and threads on a "
                                        "CPU); the differences are listed first either way"),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON instead of tables"),
    no_trace: bool = typer.Option(False, "--no-trace", help="Do not read traces (op counts from ops.csv only)"),
    fail_on: List[str] = typer.Option([], "--fail-on", help=f"Gate rule {FORM}; the sign is required "
                                      "(repeatable): exit 1 on a regression beyond both runs' spread, 3 when it "
                                      "cannot be decided (noisy, first call, overlapping spreads), 2 on bad input "
                                      "(docs/ci-gate.md)"),
    fmt: str = typer.Option("text", "--format", help="text or markdown (a CI job summary / PR comment)"),
) -> None:
    """Compare runs side by side: figures, per-block times, operator and kernel counts; ratios are B/A."""
    from lmprof.printable import json_text

    from lmprof.analysis.compare import compare_runs, trace_counts
    from lmprof.errors import ConfigError
    from lmprof.record.run import Run

    if fmt not in ("text", "markdown"):
        raise ConfigError(f"--format {fmt!r}: expected text or markdown")
    gate_result = None
    if fail_on:
        from lmprof.analysis.gate import gate, parse_condition

        conditions = [parse_condition(t) for t in fail_on]  # bad rules fail before any run is read
        if len(runs) != 2:
            raise ConfigError(f"--fail-on compares exactly two runs (BASE NEW), got {len(runs)}")
    loaded = [Run.load(p) for p in runs]
    if fail_on:
        gate_result = gate(loaded[0], loaded[1], conditions, force=force, allow_env_diff=allow_env_diff)
    counts = None if no_trace or fmt == "markdown" else [trace_counts(r) for r in loaded]
    result = compare_runs(loaded, allow_different_models=force, allow_mixed_modes=force,
                          allow_env_diff=allow_env_diff, trace_counts=counts)
    if json_out:
        data = result.to_dict()
        if gate_result is not None:
            from dataclasses import asdict

            data["gate"] = {**asdict(gate_result), "verdict": gate_result.verdict, "exit_code": gate_result.exit_code}
        typer.echo(json_text(data))
    elif fmt == "markdown":
        from lmprof.show.gate_view import markdown

        typer.echo(markdown(result, gate_result, [str(p) for p in runs]), nl=False)
    else:
        render(result, [str(p) for p in runs])
        if gate_result is not None:
            render_gate(gate_result)
    if gate_result is not None and gate_result.exit_code:
        raise typer.Exit(gate_result.exit_code)


def render_gate(g: "GateResult") -> None:
    """Print the gate's verdict per rule and overall (the last line a CI log shows)."""
    from rich.table import Table

    from lmprof.show.gate_view import CHECK_HEADER, check_rows, gate_notes

    t = Table(title="Performance gate (B against A)", title_justify="left", show_edge=False)
    for h in CHECK_HEADER[:-1]:  # the why of each rule follows the table, whole: a CI log is read there
        t.add_column(h, overflow="fold")
    rows = check_rows(g.checks)
    for row in rows:
        t.add_row(*[Text(c) for c in row[:-1]])
    console.print()
    console.print(t)
    for row in rows:
        console.print(f"{row[0]}: {row[-1]}", markup=False, soft_wrap=True)
    for line in gate_notes(g):
        console.print(line, markup=False, soft_wrap=True)
    word = {"pass": "pass", "fail": "FAIL", "undecided": "cannot decide"}[g.verdict]
    failed = [c.condition.metric for c in g.checks if c.verdict == g.verdict and g.verdict != "pass"]
    console.print(f"gate: {word}" + (f" ({', '.join(failed)})" if failed else "") + f" — exit {g.exit_code}",
                  markup=False)


def render(c: "Comparison", folders: Sequence[str]) -> None:
    """Print the comparison's tables to the console: the runs, where their environments differ and what
    marks their timings carry first, then the figures."""
    from lmprof.show.gate_view import env_lines

    for i, (label, rid, desc, folder) in enumerate(zip(c.labels, c.run_ids, c.descriptions, folders)):
        console.print(f"[bold]{escape(label)}[/bold] {escape(rid)}  ({escape(desc)})  {escape(folder)}", markup=True)
        for mark in c.run_marks[i] if c.run_marks else ():
            console.print(f"  [bold red]{escape(mark.split(':', 1)[0].upper())}[/bold red]:{escape(mark.split(':', 1)[1])}",
                          markup=True)
    for line in env_lines(c):
        console.print(line, markup=False)
    for w in c.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", markup=True)
    console.print("X/A = X's value / A's value; 'X vs A' = how many times better or worse X is "
                  "(A/X for times, bytes, energy; X/A for throughput and utilisation)")
    titles: tuple[tuple[Group, str], ...] = (("headline", "Figures"), ("compute", "Compute efficiency"),
                                             ("memory", "Memory"), ("energy", "Energy"), ("other", "Other figures"))
    for group, title in titles:
        rows = c.group(group)
        if rows and any(v is not None for r in rows for v in r.values):
            console.print()
            console.print(_metric_table(c, rows, title))
    if c.phases:
        console.print()
        console.print(_block_table(c, list(c.phases), "Phases (ms per step, scaled to the clean step)"))
        console.print()
        console.print(_block_table(c, list(c.blocks), "Blocks (ms per step, scaled to the clean step)"))
    console.print()
    console.print(_count_table(c, list(c.ops), c.op_totals, f"Operator calls per step — {c.ops_source}"))
    if c.kernels and c.kernel_totals:
        console.print()
        console.print(_count_table(c, list(c.kernels), c.kernel_totals, "Kernel launches per step (trace)"))


def _fmt_ratio(r: float | None, higher_is_better: bool | None, marks: Sequence[str] = ()) -> Text:
    if r is None:
        return Text("")
    text = f"{r:.2f}x"
    if higher_is_better is None or abs(r - 1) <= _NEUTRAL_BAND or marks:
        return Text(text)  # a ratio resting on a noisy or first-call figure is not coloured as a finding
    good = (r > 1) == higher_is_better
    return Text(text, style="green" if good else "red")


def _metric_table(c: "Comparison", rows: Sequence["MetricRow"], title: str) -> "Table":
    from rich.table import Table

    from lmprof.show.format import number

    from lmprof.analysis.marks import tag

    t = Table(title=title, title_justify="left", show_edge=False)
    t.add_column("figure")
    for label in c.labels:
        t.add_column(label, justify="right")
    for label in c.labels[1:]:
        t.add_column(f"{label}/A", justify="right")
        t.add_column(f"{label} vs A", justify="right")
    for m in rows:
        marks = m.marks or tuple(() for _ in m.values)
        cells = [Text("n/a" if v is None else number(v, m.unit) + tag(k)) for v, k in zip(m.values, marks)]
        pairs = [x for i, (r, s) in enumerate(zip(m.ratios[1:], m.speedups[1:]), 1)
                 for x in (_fmt_ratio(r, m.higher_is_better, m.ratio_marks(i)), Text(_verdict(s, m.ratio_marks(i))))]
        t.add_row(Text(m.key), *cells, *pairs)
    return t


def _verdict(speedup: float | None, marks: Sequence[str] = ()) -> str:
    from lmprof.analysis.marks import tag

    if speedup is None:
        return ""
    if abs(speedup - 1) <= _NEUTRAL_BAND:
        return "same" + tag(marks)
    return (f"{speedup:.2f}x better" if speedup > 1 else f"{1 / speedup:.2f}x worse") + tag(marks)


def _block_table(c: "Comparison", rows: Sequence["BlockRow"], title: str) -> "Table":
    from rich.table import Table

    from lmprof.analysis.marks import tag

    t = Table(title=title, title_justify="left", show_edge=False)
    t.add_column("block")
    t.add_column("phase")
    for i, label in enumerate(c.labels):  # block times are timings: a run's marks head its column
        t.add_column(Text(label + tag([m.split(":", 1)[0] for m in c.run_marks[i]] if c.run_marks else [])),
                     justify="right")
    for label in c.labels[1:]:
        t.add_column(f"{label}/A", justify="right")
    # Operators (eager) or compiled kernels per step, per block: what a compiled run fused away.
    with_ops = any(v is not None for b in rows for v in b.ops)
    if with_ops:
        for label in c.labels:
            t.add_column(f"{label} ops", justify="right")
    for b in rows:
        cells = ["—" if v is None else f"{v:.3f}" for v in b.times_ms]
        ops = ["—" if v is None else _count(v) for v in b.ops] if with_ops else []
        t.add_row(b.name, b.phase, *cells, *[_fmt_ratio(r, False) for r in b.ratios[1:]], *ops)
    if with_ops:
        t.caption = "ops: operators called directly in the block per step (eager), or compiled kernels it owns"
    return t


def _count_table(c: "Comparison", rows: Sequence["CountRow"], totals: Sequence[float], title: str) -> "Table":
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False)
    t.add_column("name", overflow="fold", max_width=60)
    t.add_column("change")
    for label in c.labels:
        t.add_column(label, justify="right")
    for label in c.labels[1:]:
        t.add_column(f"{label}−A", justify="right")
    changed = [r for r in rows if r.change != "same"]
    tally = {k: sum(r.change == k for r in rows) for k in ("appeared", "disappeared", "changed")}
    t.caption = ", ".join(f"{n} {k}" for k, n in tally.items())
    for r in changed[:_TOP_COUNT_ROWS]:
        t.add_row(r.name, r.change, *[_count(x) for x in r.counts], *[_delta(d) for d in r.deltas[1:]])
    if len(changed) > _TOP_COUNT_ROWS:
        t.add_row(f"... {len(changed) - _TOP_COUNT_ROWS} more changed (see --json)", "", *["" for _ in c.labels],
                  *["" for _ in c.labels[1:]])
    same = len(rows) - len(changed)
    if same:
        t.add_row(f"({same} unchanged)", "", *["" for _ in c.labels], *["" for _ in c.labels[1:]])
    t.add_section()
    t.add_row("total", "", *[_count(x) for x in totals], *[_delta(x - totals[0]) for x in totals[1:]])
    return t


def _count(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def _delta(d: float) -> str:
    return "0" if abs(d) < 1e-9 else ("+" if d > 0 else "−") + _count(abs(d))
