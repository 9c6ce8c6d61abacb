"""The run report: one self-contained HTML page for one lmprof run (see docs/reports.md)."""
from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lmprof.analysis.advice import RULES, advise, roofline_bound
from lmprof.analysis.recommendation import Recommendation
from lmprof.analysis.marks import FIRST_CALL, NOISY, marks, tag
from lmprof.errors import DataError
from lmprof.atomic import write_text
from lmprof.outdir import check_output_file
from lmprof.modes import MODES, Mode, traits
from lmprof.record.catalogue import Group, MetricSpec, energy_key, group_of, in_catalogue_order, ranked
from lmprof.record.run import Run
from lmprof.show.blocks import block_cells, block_table, fused_kernel_lines, off_goal_lines, row_label
from lmprof.show.format import config_line, human_bytes, metric_spread, metric_value, run_title
from lmprof.show.html import (
    NOT_RECORDED, REPORT_NAME, Absent, Bullets, Card, Cards, Cell, CellLike, Details, Embedder, Figure, Heading, Para, Part,
    Rec, Recs, Section, Table, TraceLink, figure, file_inside, generic_table, kv_table, local_href, page, table,
)
from lmprof.show.trace_findings import TraceFindings, trace_findings, trace_parts
from lmprof.show.literal import literal_text
from lmprof.show.watch_report import watch_parts


def headline_slots(mode: Mode) -> list[tuple[MetricSpec, ...]]:
    """The headline cards of a ``mode`` run, in order: each the catalogue figures of one card rank, the
    first the run has being shown (measured energy per token before estimated)."""
    slots: dict[int, list[MetricSpec]] = {}
    for m in ranked("card", mode):
        slots.setdefault(m.card or 0, []).append(m)
    return [tuple(v) for v in slots.values()]


# Headline cards per mode, in order (the catalogue's card ranks); a figure the run lacks shows
# "not recorded in this run".
HEADLINE: dict[str, tuple[tuple[MetricSpec, ...], ...]] = {
    mode: tuple(headline_slots(mode)) for mode in MODES}
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "prefill": "#55a868", "decode": "#8172b3",
                "step": "#9a9a9a"}
TOP_OPS = 15
# How a headline card says what its figure rests on (analysis/marks.py).
CARD_MARKS = {FIRST_CALL: "first call, not a clean median", NOISY: "noisy run: not to be trusted as it stands"}
# Tables shown in their own sections; any other run table goes under "Other tables".
_OWN_TABLES = {"energy", "memory", "roofline", "attribution"}



def _headline_card(run: Run, slot: Sequence[MetricSpec]) -> Card:
    first = slot[0]
    label = first.label
    key = next((m.name for m in slot if m.name in run.metrics), None)
    if key is None:
        # A figure never written may have its reason on another (energy per token: energy.total's note).
        for spec in slot:
            why = run.metric(spec.na_reason_from) if spec.na_reason_from else None
            if why is not None and why.value is None and why.note:
                return Card(label, None, f"n/a: {why.note}", key=first.name)
        return Card(label, None, NOT_RECORDED, key=first.name)
    m = run.metrics[key]
    if m.value is None:
        return Card(label, None, f"n/a: {m.note or 'no reason recorded'}", key=key, source=m.source)
    found = marks(run, key, m.unit)
    if FIRST_CALL in found:  # a label's "(clean median)" is exactly what a first call is not
        label = label.split(" (", 1)[0]
    shown = [CARD_MARKS[k] for k in found]
    return Card(label, metric_value(m), metric_spread(m), key=key, source=m.source, note=m.note, marks=shown)


def metrics_table(run: Run, keys: Sequence[str]) -> Table:
    """Figure, value, p10–p90, source and note (n/a with its reason) for ``keys``."""
    rows = []
    for k in keys:
        m = run.metrics[k]
        value = Cell("n/a", "na") if m.value is None else metric_value(m) + tag(marks(run, k, m.unit))
        rows.append([Cell(k, "code"), value, metric_spread(m), Cell(m.source or "", "badge"),
                     Cell(m.note or "", "note")])
    return table(["figure", "value", "p10 – p90", "source", "note"], rows, num=(1, 2), cls="metrics")


def _keys(run: Run, group: Group) -> list[str]:
    """The run's figures of one catalogue group, in the run's order."""
    return [k for k in run.metrics if group_of(k) == group]


# ================================================================================================
# Where the step goes: table and chart
# ================================================================================================


def blocks_parts(run: Run) -> list[Part]:
    """The per-block table: ms per phase (scaled to the clean step), total and share."""
    headers, rows, last = block_table(run)
    rows.append(last)
    out: list[Part] = [table(headers, rows, num=range(1, len(headers)), cls="blocks", total_last=True)]
    off = off_goal_lines(run)
    if off:
        out += [Para("Uncertain blocks: their time misses attribution's goal against a per-block stopwatch "
                     "(+-10%, matmul blocks +-5%)."), Bullets(off)]
    lines = fused_kernel_lines(run)
    if lines:
        out += [Para("Fused kernels: each one's time is split among the blocks it fused (fused ms)."), Bullets(lines)]
    return out


@literal_text
def block_chart_png(run: Run) -> bytes | None:
    """Horizontal bars per block, stacked by phase (forward/backward or prefill/decode), as PNG bytes."""
    if not run.blocks:
        return None
    from matplotlib.figure import Figure  # lazy: matplotlib only when a chart is drawn

    order, phases, cells, _ = block_cells(run)
    labels = [row_label(k) for k in order]
    fig = Figure(figsize=(9.0, 0.28 * len(order) + 1.3), dpi=110)
    ax = fig.subplots()
    y = list(range(len(order)))
    left = [0.0] * len(order)
    for phase in [*phases, "step"]:
        widths = [cells[k].get(phase, 0.0) for k in order]
        if not any(widths):
            continue
        ax.barh(y, widths, left=left, color=PHASE_COLORS.get(phase, "#777777"), label=phase, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    unit = traits(run.mode).unit
    ax.set_xlabel(f"ms per {unit} (scaled to the clean {unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def ops_parts(run: Run, top: int = TOP_OPS) -> list[Part]:
    """Top operators by self CPU time, per profiled step."""
    has_dev = any(o.device_ms for o in run.ops)
    headers = ["operator", "phase", "calls", "self ms", "total ms", "self %"] + (["device ms"] if has_dev else [])
    rows = []
    for o in run.ops[:top]:
        row: list[CellLike] = [Cell(o.name, "code"), o.phase, f"{o.calls:,}", f"{o.self_ms:.3f}",
                               f"{o.total_ms:.3f}", f"{o.self_pct:.1f}"]
        if has_dev:
            row.append(f"{o.device_ms:.3f}" if o.device_ms else "")
        rows.append(row)
    out: list[Part] = [table(headers, rows, num=range(2, len(headers)), cls="ops")]
    if len(run.ops) > top:
        out.append(Para(f"{len(run.ops) - top} more in ops.csv.", intro=True))
    return out


# ================================================================================================
# Recommendations, plots, compute, memory, energy, notes, configuration, trace
# ================================================================================================


def recommendations_part(recs: Sequence[Recommendation]) -> Part:
    """One panel per recommendation: what, why, what to try, and the evidence with thresholds."""
    if not recs:
        names = ", ".join(r.__name__.removeprefix("rule_") for r in RULES)
        return Absent(f"No rule fired on this run's figures (rules checked: {names}).")
    return Recs([Rec(r.rule, r.title, r.why, list(r.actions), [e.describe() for e in r.evidence], list(r.notes))
                 for r in recs])


def _pngs(run: Run, pred: Callable[[str, str], bool], used: Embedder) -> list[Part]:
    """Embedded figures for the run's PNG files whose (role, name) match ``pred``.

    ``used`` embeds each distinct file once however many names list it, and bounds the size.
    """
    out: list[Part] = []
    for role, name in run.files.items():
        if not name.lower().endswith(".png") or name in used.names or not pred(role.lower(), name.lower()):
            continue
        path = file_inside(run.folder, name)  # never embed a file from outside the run
        used.names.add(name)
        if path is None:
            out.append(Absent(f"{name}: not a file inside the run folder, not shown"))
            continue
        if not path.is_file():
            out.append(Absent(f"{name}: listed in run.json but the file is missing"))
            continue
        shown = used.png(path, f"{name} ({role})", name)
        if shown is not None:
            out.append(shown)
    return out


def compute_parts(run: Run, used: Embedder) -> list[Part]:
    """MFU, FLOPs, peaks, and the roofline (PNG and table) when recorded."""
    keys = in_catalogue_order(_keys(run, "compute"))  # utilisations first
    parts: list[Part] = [metrics_table(run, keys)] if keys else []
    plots = _pngs(run, lambda role, name: "roofline" in role or "roofline" in name, used)
    parts += plots
    if run.tables.get("roofline"):
        # A noisy run's time cannot call a block overhead-bound: the bound shown is what its figures support.
        rows = [{**r, "bound": roofline_bound(run, r)} if "bound" in r else r for r in run.tables["roofline"]]
        parts.append(Details(f"Roofline points ({len(rows)} blocks)", [generic_table(rows)]))
    if not parts:
        return [Absent("MFU, FLOPs and the roofline were " + NOT_RECORDED)]
    if not any(isinstance(q, Figure) for q in plots) and not run.tables.get("roofline"):
        parts.append(Absent("roofline: " + NOT_RECORDED))
    return parts


def memory_parts(run: Run, used: Embedder) -> list[Part]:
    """Measured vs estimated memory by category, the other memory figures, and memory plots."""
    parts: list[Part] = []
    rows = run.tables.get("memory")
    if rows:
        body = []
        for r in rows:
            diff = r.get("diff_pct")
            body.append(["" if r.get("category") is None else str(r["category"]),
                         human_bytes(r["measured_bytes"]) if r.get("measured_bytes") is not None else Cell("n/a", "na"),
                         human_bytes(r["estimated_bytes"]) if r.get("estimated_bytes") is not None else "—",
                         "" if diff is None else f"{diff:+.1f}%", Cell(str(r.get("note") or ""), "note")])
        parts.append(table(["category", "measured", "estimated", "measured vs estimated", "note"], body,
                           num=(1, 2, 3), cls="memory"))
    keys = _keys(run, "memory")
    if keys:
        figures = metrics_table(run, keys)
        parts.append(Details("Memory figures", [figures]) if rows else figures)
    parts += _pngs(run, lambda role, name: "memory" in role or "memory" in name, used)
    return parts if parts else [Absent("memory was " + NOT_RECORDED)]


def energy_parts(run: Run) -> list[Part]:
    """Energy figures (n/a with the meter's reason) and the per-domain table."""
    total = run.metric(energy_key("total"))
    keys = _keys(run, "energy")
    if not keys and not run.tables.get("energy"):
        return [Absent("energy was " + NOT_RECORDED)]
    parts: list[Part] = []
    if total is not None and total.value is None:
        parts.append(Absent(f"n/a: {total.note or 'no reason recorded'}"))
    if keys:
        parts.append(metrics_table(run, keys))
    if run.tables.get("energy"):
        parts += [Heading("Meters"), generic_table(run.tables["energy"])]
    return parts


def notes_part(run: Run) -> Part:
    if not run.notes:
        return Absent("No notes for this run.")
    return Bullets([str(n) for n in run.notes])


def _flat_config(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in config.items():
        if isinstance(v, Mapping):
            out += _flat_config(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def config_parts(config: Mapping[str, Any]) -> list[Part]:
    """Set options as a table; options left unset (None) named on one line below it."""
    pairs = _flat_config(config)
    unset = [k for k, v in pairs if v is None]
    parts: list[Part] = [kv_table([(k, v) for k, v in pairs if v is not None])]
    if unset:
        parts.append(Para(f"Not set (defaults apply): {', '.join(unset)}.", intro=True))
    return parts


def trace_file_part(run: Run, report_dir: Path) -> Part:
    """A relative link to the trace and how to open it (only a file inside the run folder is linked)."""
    name = run.files.get("trace")
    if not name:
        return Absent("no trace file was written by this run")
    path = file_inside(run.folder, name)
    if path is None:
        return Absent(f"the record names the trace {name!r}, which is not a file inside the run folder: not linked")
    size = f" ({human_bytes(path.stat().st_size)})" if path.is_file() else " (file missing)"
    return TraceLink(local_href(path, report_dir), name, size)


def render_run_report(run: Run, report_dir: str | Path | None = None,
                      trace: TraceFindings | None = None) -> str:
    """The run report as an HTML string. ``report_dir`` is where it will live (for relative links)."""
    rdir = Path(report_dir) if report_dir is not None else Path(run.folder or ".")
    tf = trace if trace is not None else trace_findings(run)
    recs = advise(run, tf.facts)
    used = Embedder()

    headline = Cards([_headline_card(run, slot) for slot in HEADLINE[run.mode]])
    if run.blocks:
        chart = block_chart_png(run)
        blocks: list[Part] = ([figure(chart, "Per-block time, stacked by phase")] if chart else []) + blocks_parts(run)
    else:
        blocks = [Absent("per-block times were " + NOT_RECORDED)]
    other_tables = [(k, v) for k, v in run.tables.items() if k not in _OWN_TABLES and v]

    sections = [
        Section("headline", "Headline figures", [headline],
                "Medians of repeated clean steps; labels say whether a figure was measured, estimated or derived."),
        Section("recommendations", "Recommendations", [recommendations_part(recs)],
                "Rules over the figures below; each cites the numbers that made it fire."),
        Section("blocks", "Where the time goes", blocks,
                "Milliseconds are each block's share of the profiled step applied to the clean step; "
                "shares are of the profiled step."),
        Section("operators", "Top operators", ops_parts(run) if run.ops else [Absent("operators were " + NOT_RECORDED)],
                "torch.profiler operators by self CPU time, per profiled step."),
        Section("compute", "Compute efficiency and roofline", compute_parts(run, used)),
        Section("memory", "Memory", memory_parts(run, used)),
        Section("energy", "Energy", energy_parts(run)),
        Section("trace-analysis", "Trace analysis", trace_parts(tf)),
        *([Section("watch", "Whole run", watch_parts(run, rdir),
                   "Every step after the measured window: step time and memory, what the detectors saw against "
                   "the clean steps' noise, and the windows captured when they did.")] if run.watch else []),
        Section("notes", "Notes", [notes_part(run)]),
    ]
    # Plots the run listed that no section above claimed still belong in the report.
    other: list[Part] = list(_pngs(run, lambda role, name: True, used))
    for k, v in other_tables:
        other += [Heading(k), Details(f"{len(v)} row{'s' if len(v) != 1 else ''}", [generic_table(v)])]
    if other:
        sections.append(Section("other", "Other plots and tables", other))
    sections += [
        Section("all-figures", "All figures", [metrics_table(run, list(run.metrics)) if run.metrics
                                               else Absent("no figures")],
                "Every figure of the run: n/a means the figure could not be taken here, and the note says why."),
        Section("environment", "Environment", [kv_table(list(run.env.model_dump().items()))]),
        Section("configuration", "Configuration", config_parts(run.config)),
        Section("trace", "Trace file", [trace_file_part(run, rdir)]),
    ]
    sections = [dataclasses.replace(s, nav="Other" if s.sid == "other" else s.title.split(" and ")[0])
                for s in sections]
    return page("run_report.html.j2", title=f"lmprof report — {run.id}", sections=sections, script=False,
                heading=run_title(run, with_params=False), config_line=config_line(run), run_id=run.id,
                created=run.created, noise=list(run.noise) if run.noisy else None)


def report_line(path: Path) -> str:
    """The line that says where a run's report was written: plain text, printed with rich markup off (a
    folder may be named ``runs[bold]``, which markup would swallow)."""
    return f"report: {path}  (open it in a browser; the trace opens in https://ui.perfetto.dev)"


def write_run_report(run: Run, folder: str | Path | None = None, *, out: str | Path | None = None) -> Path:
    """Write the run report to ``out``, or ``folder/report.html`` (default: the run's folder)."""
    if out is not None:
        path = Path(out)
    else:
        base = folder if folder is not None else run.folder
        if base is None:
            raise DataError("write_run_report: no folder given and the run was never saved")
        path = Path(base) / REPORT_NAME
    check_output_file(path)
    write_text(path, render_run_report(run, report_dir=path.parent))
    return path
