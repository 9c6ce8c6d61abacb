"""The run report: one self-contained HTML page for one lmprof run (see docs/reports.md)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lmprof.analysis.advice import RULES, Recommendation, advise
from lmprof.errors import DataError
from lmprof.atomic import write_text
from lmprof.outdir import check_output_file
from lmprof.record.run import Run
from lmprof.show.blocks import block_cells, fused_cells, fused_kernel_lines, off_goal_lines, row_label
from lmprof.show.format import config_line, human_bytes, metric_spread, metric_value, run_title
from lmprof.show.html import (
    NOT_RECORDED, REPORT_NAME, Embedder, absent, badge, esc, figure, file_inside, generic_table, kv_html, local_href, page,
    section, table,
)
from lmprof.show.trace_findings import TraceFindings, trace_findings, trace_html
from lmprof.show.literal import literal_text


# Headline cards per mode, in order; a key the run lacks shows "not recorded in this run".
HEADLINE = {
    "train": ("step_time", "tokens_per_s", "mfu", "memory.peak", "@energy_per_token", "profiler_overhead", "loss"),
    "infer": ("ttft", "tpot", "decode_tokens_per_s", "e2e_latency", "prefill.mfu", "decode.mbu", "memory.peak",
              "kv_cache", "@energy_per_token", "profiler_overhead"),
}
LABELS = {
    "step_time": "step time (clean median)", "tokens_per_s": "throughput", "mfu": "MFU",
    "memory.peak": "peak memory", "@energy_per_token": "energy per token",
    "profiler_overhead": "profiler overhead", "loss": "loss", "ttft": "time to first token",
    "tpot": "time per output token", "decode_tokens_per_s": "decode throughput",
    "e2e_latency": "end-to-end latency", "kv_cache": "KV cache", "prefill.mfu": "prefill MFU",
    "decode.mbu": "decode bandwidth use (MBU)",
}
COMPUTE_PREFIXES = ("flops.", "peak.", "bytes.")
COMPUTE_KEYS = ("mfu", "hfu", "mbu")
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "prefill": "#55a868", "decode": "#8172b3",
                "step": "#9a9a9a"}
TOP_OPS = 15
# Tables shown in their own sections; any other run table goes under "Other tables".
_OWN_TABLES = {"energy", "memory", "roofline", "attribution"}



def energy_per_token_key(run: Run) -> str | None:
    """The energy-per-token metric: measured (``energy.per_token``) before estimated."""
    keys = [k for k, m in run.metrics.items() if k.startswith("energy.") and m.unit.startswith("J/token")]
    keys.sort(key=lambda k: (".estimated." in k, k))
    return keys[0] if keys else None


def _headline_card(run: Run, key: str) -> str:
    label = LABELS.get(key, key)
    if key == "@energy_per_token":
        real = energy_per_token_key(run)
        if real is None:
            total = run.metric("energy.total")
            why = f"n/a: {total.note}" if total is not None and total.value is None and total.note else NOT_RECORDED
            return _card(label, None, why, key="energy per token")
        key = real
    m = run.metric(key)
    if m is None:
        return _card(label, None, NOT_RECORDED, key=key)
    if m.value is None:
        return _card(label, None, f"n/a: {m.note or 'no reason recorded'}", key=key, source=m.source)
    spread = metric_spread(m)
    return _card(label, metric_value(m), spread, key=key, source=m.source, note=m.note)


def _card(label: str, value: str | None, sub: str, *, key: str, source: str | None = None,
          note: str | None = None) -> str:
    title = f' title="{esc(note)}"' if note else ""
    if value is None:
        return (f'<div class="card" data-key="{esc(key)}"><div class="label">{esc(label)} {badge(source)}</div>'
                f'<div class="value na">{esc(sub)}</div></div>')
    return (f'<div class="card" data-key="{esc(key)}"{title}><div class="label">{esc(label)} {badge(source)}</div>'
            f'<div class="value">{esc(value)}</div><div class="spread">{esc(sub) or "&nbsp;"}</div></div>')


def metrics_table(run: Run, keys: Sequence[str]) -> str:
    """Figure, value, p10–p90, source and note (n/a with its reason) for ``keys``."""
    rows = []
    for k in keys:
        m = run.metrics[k]
        value = metric_value(m)
        cell = '<span class="na">n/a</span>' if m.value is None else esc(value)
        rows.append([f"<code>{esc(k)}</code>", cell, esc(metric_spread(m)), badge(m.source),
                     f'<span class="note">{esc(m.note or "")}</span>'])
    return table(["figure", "value", "p10 – p90", "source", "note"], rows, num=(1, 2), cls="metrics")


def _keys(run: Run, pred: Callable[[str], bool]) -> list[str]:
    return [k for k in run.metrics if pred(k)]


# ================================================================================================
# Where the step goes: table and chart
# ================================================================================================


def blocks_html(run: Run) -> str:
    """The per-block table: ms per phase (scaled to the clean step), total and share."""
    order, phases, cells, pct = block_cells(run)
    fused = fused_cells(run)  # compiled runs: the ms of each row that came from fused kernels
    rows, total, fused_total = [], 0.0, 0.0
    for key in order:
        row = cells[key]
        s = sum(row.values())
        total += s
        extra = [f"{fused.get(key, 0.0):.3f}"] if fused is not None else []
        fused_total += fused.get(key, 0.0) if fused is not None else 0.0
        rows.append([esc(row_label(key)), *[f"{row[p]:.3f}" if p in row else "" for p in phases],
                     f"{s:.3f}", f"{pct[key]:.1f}%", *extra])
    rows.append(["total", *["" for _ in phases], f"{total:.3f}", "100.0%",
                 *([f"{fused_total:.3f}"] if fused is not None else [])])
    headers = ["block", *[f"{p} ms" for p in phases], "total ms", "share", *(["fused ms"] if fused is not None else [])]
    out = table(headers, rows, num=tuple(range(1, len(headers))), cls="blocks", total_last=True)
    off = off_goal_lines(run)
    if off:
        out += ("<p>Uncertain blocks: their time misses attribution's goal against a per-block stopwatch "
                "(+-10%, matmul blocks +-5%).</p><ul>" + "".join(f"<li>{esc(line)}</li>" for line in off) + "</ul>")
    lines = fused_kernel_lines(run)
    if lines:
        out += ("<p>Fused kernels: each one's time is split among the blocks it fused (fused ms).</p><ul>"
                + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")
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
    unit = "generation" if run.mode == "infer" else "step"
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


def ops_html(run: Run, top: int = TOP_OPS) -> str:
    """Top operators by self CPU time, per profiled step."""
    has_dev = any(o.device_ms for o in run.ops)
    headers = ["operator", "phase", "calls", "self ms", "total ms", "self %"] + (["device ms"] if has_dev else [])
    rows = []
    for o in run.ops[:top]:
        row = [f"<code>{esc(o.name)}</code>", esc(o.phase), f"{o.calls:,}", f"{o.self_ms:.3f}",
               f"{o.total_ms:.3f}", f"{o.self_pct:.1f}"]
        if has_dev:
            row.append(f"{o.device_ms:.3f}" if o.device_ms else "")
        rows.append(row)
    more = f"<p class=\"intro\">{len(run.ops) - top} more in ops.csv.</p>" if len(run.ops) > top else ""
    return table(headers, rows, num=tuple(range(2, len(headers))), cls="ops") + more


# ================================================================================================
# Trace analysis (optional module; guarded)
# ================================================================================================


def recommendations_html(recs: Sequence[Recommendation]) -> str:
    """One panel per recommendation: what, why, what to try, and the evidence with thresholds."""
    if not recs:
        names = ", ".join(r.__name__.removeprefix("rule_") for r in RULES)
        return absent(f"No rule fired on this run's figures (rules checked: {names}).")
    out = []
    for r in recs:
        actions = "".join(f"<li>{esc(a)}</li>" for a in r.actions)
        evidence = "; ".join(f"<code>{esc(e.describe())}</code>" for e in r.evidence)
        notes = "".join(f"<div class=\"evidence\">{esc(n)}</div>" for n in r.notes)
        out.append(f'<div class="rec" data-rule="{esc(r.rule)}"><h3>{esc(r.title)}</h3><p>{esc(r.why)}</p>'
                   f"<ul>{actions}</ul><div class=\"evidence\">Evidence: {evidence}</div>{notes}</div>")
    return "".join(out)


def _pngs(run: Run, pred: Callable[[str, str], bool], used: Embedder) -> list[str]:
    """Embedded <figure>s for the run's PNG files whose (role, name) match ``pred``.

    ``used`` embeds each distinct file once however many names list it, and bounds the size.
    """
    out = []
    for role, name in run.files.items():
        if not name.lower().endswith(".png") or name in used.names or not pred(role.lower(), name.lower()):
            continue
        path = file_inside(run.folder, name)  # never embed a file from outside the run
        used.names.add(name)
        if path is None:
            out.append(absent(f"{name}: not a file inside the run folder, not shown"))
            continue
        if not path.is_file():
            out.append(absent(f"{name}: listed in run.json but the file is missing"))
            continue
        shown = used.png(path, f"{name} ({role})", name)
        if shown:
            out.append(shown)
    return out


def compute_html(run: Run, used: Embedder) -> str:
    """MFU, FLOPs, peaks, and the roofline (PNG and table) when recorded."""
    keys = [k for k in COMPUTE_KEYS if k in run.metrics] + _keys(run, lambda k: k.startswith(COMPUTE_PREFIXES))
    parts = [metrics_table(run, keys)] if keys else []
    parts += _pngs(run, lambda role, name: "roofline" in role or "roofline" in name, used)
    if run.tables.get("roofline"):
        rows = run.tables["roofline"]
        parts.append(f"<details><summary>Roofline points ({len(rows)} blocks)</summary>{generic_table(rows)}</details>")
    if not parts:
        return absent("MFU, FLOPs and the roofline were " + NOT_RECORDED)
    if not any("roofline" in p for p in parts):
        parts.append(absent("roofline: " + NOT_RECORDED))
    return "".join(parts)


def memory_html(run: Run, used: Embedder) -> str:
    """Measured vs estimated memory by category, the other memory figures, and memory plots."""
    parts = []
    rows = run.tables.get("memory")
    if rows:
        body = []
        for r in rows:
            diff = r.get("diff_pct")
            body.append([esc(r.get("category")),
                         esc(human_bytes(r["measured_bytes"])) if r.get("measured_bytes") is not None else '<span class="na">n/a</span>',
                         esc(human_bytes(r["estimated_bytes"])) if r.get("estimated_bytes") is not None else "—",
                         "" if diff is None else f"{diff:+.1f}%", f'<span class="note">{esc(r.get("note"))}</span>'])
        parts.append(table(["category", "measured", "estimated", "measured vs estimated", "note"], body,
                           num=(1, 2, 3), cls="memory"))
    keys = _keys(run, lambda k: k.startswith("memory.") or k.startswith("kv_cache"))
    if keys:
        parts.append(("<details><summary>Memory figures</summary>" if rows else "")
                     + metrics_table(run, keys) + ("</details>" if rows else ""))
    parts += _pngs(run, lambda role, name: "memory" in role or "memory" in name, used)
    return "".join(parts) if parts else absent("memory was " + NOT_RECORDED)


def energy_html(run: Run) -> str:
    """Energy figures (n/a with the meter's reason) and the per-domain table."""
    total = run.metric("energy.total")
    keys = _keys(run, lambda k: k.startswith("energy."))
    if not keys and not run.tables.get("energy"):
        return absent("energy was " + NOT_RECORDED)
    parts = []
    if total is not None and total.value is None:
        parts.append(absent(f"n/a: {total.note or 'no reason recorded'}"))
    if keys:
        parts.append(metrics_table(run, keys))
    if run.tables.get("energy"):
        parts.append("<h3>Meters</h3>" + generic_table(run.tables["energy"]))
    return "".join(parts)


def notes_html(run: Run) -> str:
    if not run.notes:
        return absent("No notes for this run.")
    return "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in run.notes) + "</ul>"


def _flat_config(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in config.items():
        if isinstance(v, Mapping):
            out += _flat_config(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def config_html(config: Mapping[str, Any]) -> str:
    """Set options as a table; options left unset (None) named on one line below it."""
    pairs = _flat_config(config)
    unset = [k for k, v in pairs if v is None]
    line = f'<p class="intro">Not set (defaults apply): {esc(", ".join(unset))}.</p>' if unset else ""
    return kv_html([(k, v) for k, v in pairs if v is not None]) + line


def trace_file_html(run: Run, report_dir: Path) -> str:
    """A relative link to the trace and how to open it (only a file inside the run folder is linked)."""
    name = run.files.get("trace")
    if not name:
        return absent("no trace file was written by this run")
    path = file_inside(run.folder, name)
    if path is None:
        return absent(f"the record names the trace {name!r}, which is not a file inside the run folder: "
                      "not linked")
    size = f" ({human_bytes(path.stat().st_size)})" if path.is_file() else " (file missing)"
    href = local_href(path, report_dir)
    return (f'<p><a href="{esc(href)}" download>{esc(name)}</a>{esc(size)}: the profiled '
            "steps as a Chrome/Kineto trace.</p>"
            "<p>Open it in Perfetto: go to <code>ui.perfetto.dev</code>, choose <b>Open trace file</b> and pick "
            "this file (it is read in your browser, nothing is uploaded). Or open <code>chrome://tracing</code> "
            "in Chrome and <b>Load</b> it. lmprof's block ranges are the <code>lmprof:*</code> slices.</p>")


def render_run_report(run: Run, report_dir: str | Path | None = None,
                      trace: TraceFindings | None = None) -> str:
    """The run report as an HTML string. ``report_dir`` is where it will live (for relative links)."""
    rdir = Path(report_dir) if report_dir is not None else Path(run.folder or ".")
    tf = trace if trace is not None else trace_findings(run)
    recs = advise(run, tf.facts)
    used = Embedder()

    headline = '<div class="cards">' + "".join(_headline_card(run, k) for k in HEADLINE[run.mode]) + "</div>"
    if run.blocks:
        chart = block_chart_png(run)
        blocks = (figure(chart, "Per-block time, stacked by phase") if chart else "") + blocks_html(run)
    else:
        blocks = absent("per-block times were " + NOT_RECORDED)
    other_tables = [(k, v) for k, v in run.tables.items() if k not in _OWN_TABLES and v]

    sections = [
        ("headline", "Headline figures", headline,
         "Medians of repeated clean steps; labels say whether a figure was measured, estimated or derived."),
        ("recommendations", "Recommendations", recommendations_html(recs),
         "Rules over the figures below; each cites the numbers that made it fire."),
        ("blocks", "Where the time goes", blocks,
         "Milliseconds are each block's share of the profiled step applied to the clean step; "
         "shares are of the profiled step."),
        ("operators", "Top operators", ops_html(run) if run.ops else absent("operators were " + NOT_RECORDED),
         "torch.profiler operators by self CPU time, per profiled step."),
        ("compute", "Compute efficiency and roofline", compute_html(run, used), None),
        ("memory", "Memory", memory_html(run, used), None),
        ("energy", "Energy", energy_html(run), None),
        ("trace-analysis", "Trace analysis", trace_html(tf), None),
        ("notes", "Notes", notes_html(run), None),
    ]
    # Plots the run listed that no section above claimed still belong in the report.
    other_pngs = _pngs(run, lambda role, name: True, used)
    if other_pngs or other_tables:
        body = "".join(other_pngs) + "".join(
            f"<h3>{esc(k)}</h3><details><summary>{len(v)} row{'s' if len(v) != 1 else ''}</summary>{generic_table(v)}</details>"
            for k, v in other_tables)
        sections.append(("other", "Other plots and tables", body, None))
    sections += [
        ("all-figures", "All figures", metrics_table(run, list(run.metrics)) if run.metrics else absent("no figures"),
         "Every figure of the run: n/a means the figure could not be taken here, and the note says why."),
        ("environment", "Environment", kv_html(list(run.env.model_dump().items())), None),
        ("configuration", "Configuration", config_html(run.config), None),
        ("trace", "Trace file", trace_file_html(run, rdir), None),
    ]
    header = (f"<h1>{esc(run_title(run, with_params=False))}</h1><p class=\"sub\">{esc(config_line(run))}<br>run "
              f"<code>{esc(run.id)}</code>, recorded {esc(run.created)}</p>")
    if run.noisy:
        header += ("<div class=\"evidence\"><strong>Noisy run</strong>: these timings are not to be trusted as they "
                   "stand.<ul>" + "".join(f"<li>{esc(r)}</li>" for r in run.noise) + "</ul></div>")
    nav = [(sid, "Other" if sid == "other" else title.split(" and ")[0]) for sid, title, _, _ in sections]
    body = "".join(section(sid, title, b, intro) for sid, title, b, intro in sections)
    return page(f"lmprof report — {run.id}", header, nav, body)


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
