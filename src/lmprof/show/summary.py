"""The terminal summary of a run (rich). Formats figures; computes none."""
from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lmprof.analysis.advice import roofline_bound
from lmprof.analysis.marks import marks, tag
from lmprof.modes import traits
from lmprof.record.catalogue import HFU, MFU, PASS_PREFIX, cost_key, ranked
from lmprof.record.run import Run
from lmprof.show.blocks import block_table, fused_kernel_lines, off_goal_lines
from lmprof.show.console import beside_bars, console_on
from lmprof.show.format import config_line, metric_spread, metric_value, number, run_title

# The terminal shows the catalogue's summary figures, in its order; run.json has every figure.
HEADLINE = tuple(m.name for m in ranked("summary"))


def metrics_table(run: Run) -> Table:
    """Every figure with its unit, spread and source; notes are numbered below the table."""
    t = Table(title="Figures", title_justify="left", show_edge=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("p10 – p90", justify="right")
    t.add_column("source")
    keys = shown_keys(run)
    for k in keys:
        m = run.metrics[k]
        label = k + (f" [{len(_notes(run, keys[: keys.index(k) + 1]))}]" if m.note else "")
        t.add_row(Text(label), Text(metric_value(m) + tag(marks(run, k, m.unit))), metric_spread(m), m.source)
    hidden = len(run.metrics) - len(keys)
    if hidden:
        t.caption = f"{hidden} more figures in run.json"
    return t


def shown_keys(run: Run) -> list[str]:
    """The summary's figures present in ``run``; an HFU only where it differs from its MFU (a
    recomputation ran: decode without a KV cache)."""
    return [k for k in HEADLINE if k in run.metrics and not _hfu_as_mfu(run, k)]


# Each pass's HFU key and the MFU key it is shown beside (the catalogue's names).
_MFU_OF_HFU = {cost_key(p, HFU): cost_key(p, MFU) for p in PASS_PREFIX}


def _hfu_as_mfu(run: Run, key: str) -> bool:
    if key not in _MFU_OF_HFU:
        return False
    mfu = run.metrics.get(_MFU_OF_HFU[key])
    return mfu is None or run.metrics[key].value == mfu.value


def _notes(run: Run, keys: list[str]) -> list[str]:
    return [f"{k}: {run.metrics[k].note}" for k in keys if run.metrics[k].note]


def blocks_table(run: Run) -> Table:
    """Blocks as rows with one column per phase, then the step's own parts; total = clean step."""
    headers, rows, last = block_table(run)
    what = traits(run.mode).unit
    t = Table(title=f"Where the {what} goes (ms, scaled to the clean {what}; share of the profiled {what})",
              title_justify="left", show_edge=False)
    t.add_column(headers[0])
    for h in headers[1:]:  # ms per phase, total ms, share and (compiled runs) of total ms, from fused kernels
        t.add_column(h, justify="right")
    for row in rows:
        t.add_row(Text(row[0]), *row[1:])
    t.add_section()
    t.add_row(*last)
    return t


def uncertain_blocks(run: Run, rel: float = 0.2, min_share: float = 1.0) -> list[str]:
    """Blocks whose time misses its goal against a per-block stopwatch, then those whose time varies over
    the profiled steps by more than ``rel`` of it (and that matter)."""
    out = [f"  uncertain: {line}" for line in off_goal_lines(run)]
    for b in run.blocks:
        if (not b.uncertain and b.spread_ms is not None and b.time_ms > 0 and b.pct >= min_share
                and b.spread_ms > rel * b.time_ms):
            out.append(f"  uncertain: {b.name} ({b.phase}) {b.time_ms:.3f} ms, p10-p90 over the profiled steps "
                       f"spans {b.spread_ms:.3f} ms")
    return out


def ops_table(run: Run, top: int = 10) -> Table:
    t = Table(title="Top operators by self CPU time (per step, profiled)", title_justify="left", show_edge=False)
    t.add_column("operator")
    t.add_column("calls", justify="right")
    t.add_column("self ms", justify="right")
    t.add_column("total ms", justify="right")
    t.add_column("self %", justify="right")
    has_dev = any(o.device_ms for o in run.ops)
    if has_dev:
        t.add_column("device ms", justify="right")
    for o in run.ops[:top]:
        row: list[str | Text] = [Text(o.name), str(o.calls), f"{o.self_ms:.3f}", f"{o.total_ms:.3f}", f"{o.self_pct:.1f}"]
        if has_dev:
            row.append(f"{o.device_ms:.3f}" if o.device_ms else "")
        t.add_row(*row)
    return t


def roofline_table(run: Run, top: int = 8) -> Table | None:
    """The blocks that take the most time, with their roofline position and bound type."""
    rows = [r for r in run.tables.get("roofline", []) if r.get("time_s")]
    if not rows:
        return None
    rows.sort(key=lambda r: r["time_s"], reverse=True)
    t = Table(title="Roofline: top blocks by time (FLOPs and bytes estimated, time measured)", title_justify="left", show_edge=False)
    for col in ("block", "phase", "FLOP", "FLOP/byte", "achieved", "of roof", "bound"):
        t.add_column(col, justify="left" if col in ("block", "phase", "bound") else "right")
    for r in rows[:top]:
        frac = r.get("roof_fraction")
        t.add_row(Text(r["name"]), r["phase"], number(r["flops"], "FLOP"), f"{r['intensity']:.3g}",
                  number(r["achieved_flops_per_s"], "FLOP/s") if r.get("achieved_flops_per_s") else "",
                  _of_roof(frac), Text(roofline_bound(run, r)))
    return t


def _of_roof(frac: float | None) -> str:
    """A block's share of its roof; above 100% the ceiling is wrong, so no figure, a mark instead."""
    if frac is None:
        return ""
    return f"{100 * frac:.1f}%" if frac <= 1.0 else "n/a (above roof: peak too low)"


def render(run: Run, console: Console, folder: str | None = None) -> None:
    """Print the whole summary of ``run`` to ``console``."""
    # Markup only where asked for, and user text (model names, folders, notes) escaped, whatever the
    # console's own markup setting: a model named 'm[/]' prints as it is.
    console.print(f"[bold]{escape(run_title(run))}[/bold]", markup=True)
    console.print(config_line(run), markup=False)
    if run.noisy:
        console.print("[bold red]NOISY RUN[/bold red]: these timings are not to be trusted as they stand:", markup=True)
        for reason in run.noise:
            console.print(f"  - {reason}", markup=False)
    console.print()
    console.print(metrics_table(run))
    for i, note in enumerate(_notes(run, shown_keys(run)), 1):
        console.print(f"  [{i}] {note}", markup=False)
    if run.blocks:
        console.print()
        console.print(blocks_table(run))
        for line in uncertain_blocks(run):
            console.print(line, markup=False)
        fused = fused_kernel_lines(run)
        if fused:
            console.print("fused kernels (each one's time is split among the blocks it fused; 'fused ms' above):")
            for line in fused:
                console.print(f"  {line}", markup=False)
    roof = roofline_table(run)
    if roof is not None:
        console.print()
        console.print(roof)
    if run.ops:
        console.print()
        console.print(ops_table(run))
    for note in run.notes:
        console.print(f"note: {note}", markup=False)
    if folder:
        console.print(f"\nrun folder: {folder}", markup=False)


def print_summary(run: Run, folder: Path, stream: TextIO, *, report: bool) -> None:
    """A written run's summary on ``stream`` (a user program's stderr: beside its progress bars), then, with
    ``report``, report.html and the line that says where it is (printed as text: a folder named ``runs[bold]``)."""
    console = console_on(stream, width=120, highlight=False, soft_wrap=True)
    with beside_bars(stream):  # the script's progress bars: the summary may come mid-training
        render(run, console, folder=str(folder))
    if report:
        from lmprof.show.run_report import report_line, write_run_report  # lazy: the report's imports are heavy

        path = write_run_report(run, folder)
        with beside_bars(stream):
            console.print(report_line(path), markup=False)


def render_text(run: Run, width: int = 120) -> str:
    """The summary as plain text (``lmprof.summary(run)``)."""
    buf = io.StringIO()
    render(run, Console(file=buf, width=width, color_system=None, highlight=False, markup=False))
    return buf.getvalue()
