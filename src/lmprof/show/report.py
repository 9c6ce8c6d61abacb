"""HTML reports people read: one self-contained file per run, and one per sweep.

A report is a single HTML file that opens offline: the stylesheet and the little script are inline,
plots are embedded as base64 PNG data URIs, and nothing is fetched from the network. The only links
are relative ones to files next to the report (the trace).

Run report sections: headline figures, recommendations, where the step goes (table + chart), top
operators, compute efficiency and roofline, memory, energy, trace analysis, notes, every figure,
environment, configuration, and the trace file. A section whose figures the run did not record says
so ("not recorded in this run", or "n/a: <reason>" when the run says why) instead of disappearing.

Sweep report: every PNG in the sweep's ``plots/``, a sortable table of runs, the best configuration
per objective, and the failed points with their reasons.

This module formats; it computes no figure (recommendations come from :mod:`lmprof.analysis.advice`).
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import html
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from lmprof.analysis.advice import RULES, Recommendation, advise
from lmprof.errors import DataError
from lmprof.record.run import Run
from lmprof.show.blocks import block_cells, row_label
from lmprof.show.format import human_bytes, metric_spread, metric_value, number

REPORT_NAME = "report.html"
_TEMPLATES = Path(__file__).parent / "templates"
NOT_RECORDED = "not recorded in this run"

# Headline cards per mode, in order; a key the run lacks shows "not recorded in this run".
HEADLINE = {
    "train": ("step_time", "tokens_per_s", "mfu", "memory.peak", "@energy_per_token", "profiler_overhead", "loss"),
    "infer": ("ttft", "tpot", "decode_tokens_per_s", "e2e_latency", "mfu", "memory.peak", "kv_cache",
              "@energy_per_token", "profiler_overhead"),
}
LABELS = {
    "step_time": "step time (clean median)", "tokens_per_s": "throughput", "mfu": "MFU",
    "memory.peak": "peak memory", "@energy_per_token": "energy per token",
    "profiler_overhead": "profiler overhead", "loss": "loss", "ttft": "time to first token",
    "tpot": "time per output token", "decode_tokens_per_s": "decode throughput",
    "e2e_latency": "end-to-end latency", "kv_cache": "KV cache",
}
COMPUTE_PREFIXES = ("flops.", "peak.", "bytes.")
COMPUTE_KEYS = ("mfu", "hfu", "mbu")
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "prefill": "#55a868", "decode": "#8172b3",
                "step": "#9a9a9a"}
TOP_OPS = 15
# Tables shown in their own sections; any other run table goes under "Other tables".
_OWN_TABLES = {"energy", "memory", "roofline", "attribution"}


# ================================================================================================
# HTML pieces
# ================================================================================================


def esc(x: object) -> str:
    """HTML-escape anything (None -> '')."""
    return "" if x is None else html.escape(str(x), quote=True)


def _template(name: str) -> str:
    return (_TEMPLATES / name).read_text(encoding="utf-8")


def badge(source: str | None) -> str:
    """A coloured measured / estimated / derived label."""
    if not source:
        return ""
    return f'<span class="src src-{esc(source)}" title="{esc(_SOURCE_HELP.get(source, ""))}">{esc(source)}</span>'


_SOURCE_HELP = {
    "measured": "read from a clock or counter",
    "estimated": "from a model or formula",
    "derived": "arithmetic on measured figures",
}


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, num: Sequence[int] = (),
          cls: str = "", total_last: bool = False) -> str:
    """A table; cells are HTML already (escape before). ``num`` are right-aligned column indexes."""
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in num else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body_rows = list(rows)
    out = []
    for r, row in enumerate(body_rows):
        tr = ' class="total"' if total_last and r == len(body_rows) - 1 else ""
        cells = "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(row))
        out.append(f"<tr{tr}>{cells}</tr>")
    return (f'<div class="scroll"><table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(out)}</tbody></table></div>')


def section(sid: str, title: str, body: str, intro: str | None = None) -> str:
    """A report section with an anchor id (the navigation links to it)."""
    p = f'<p class="intro">{intro}</p>' if intro else ""
    return f'<section id="{esc(sid)}" data-section="{esc(sid)}"><h2>{esc(title)}</h2>{p}{body}</section>'


def absent(text: str = NOT_RECORDED) -> str:
    """The line a section shows when the run has nothing for it."""
    return f'<p class="absent">{esc(text)}</p>'


def png_data_uri(data: bytes) -> str:
    """``data:image/png;base64,...`` for embedding."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure(data: bytes, caption: str, alt: str | None = None) -> str:
    """An embedded PNG with a caption."""
    return (f'<figure><img src="{png_data_uri(data)}" alt="{esc(alt or caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def page(title: str, header: str, nav: Sequence[tuple[str, str]], body: str, script: bool = False) -> str:
    """The whole document: inline CSS (and the sorting script when asked), no external resources."""
    links = "".join(f'<a href="#{esc(sid)}">{esc(label)}</a>' for sid, label in nav)
    js = f"<script>{_template('sort.js')}</script>" if script else ""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_template('report.css')}</style></head>"
        f"<body><main><header>{header}<nav>{links}</nav></header>{body}"
        f"<footer>Written by lmprof on {stamp}. Self-contained: open it anywhere, offline.</footer>"
        f"</main>{js}</body></html>\n"
    )


def _cell_value(v: Any, unit: str | None = None) -> str:
    """A table cell for a plain value: numbers formatted, None as an em dash."""
    if getattr(v, "shape", None) == () and hasattr(v, "item"):
        v = v.item()  # numpy scalars (from pandas rows) as Python numbers and bools
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if unit:
            return esc(number(float(v), unit))
        return esc(f"{v:,}" if isinstance(v, int) else f"{v:.4g}")
    text = str(v)
    return esc(text if len(text) <= 160 else text[:157] + "...")


# ================================================================================================
# Figures and metric tables
# ================================================================================================


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
    rows, total = [], 0.0
    for key in order:
        row = cells[key]
        s = sum(row.values())
        total += s
        rows.append([esc(row_label(key)), *[f"{row[p]:.3f}" if p in row else "" for p in phases],
                     f"{s:.3f}", f"{pct[key]:.1f}%"])
    rows.append(["total", *["" for _ in phases], f"{total:.3f}", "100.0%"])
    headers = ["block", *[f"{p} ms" for p in phases], "total ms", "share"]
    return table(headers, rows, num=tuple(range(1, len(headers))), cls="blocks", total_last=True)


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


@dataclass
class TraceFindings:
    """What trace analysis said about the run's trace, in a form the report can show."""

    available: bool
    reason: str | None = None
    findings: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)


_FINDING_KEYS = ("findings", "insights", "issues", "warnings", "messages", "notes")


def trace_findings(run: Run) -> TraceFindings:
    """Run :mod:`lmprof.trace.analyze` on the run's trace when that module exists; never raises."""
    trace = run.files.get("trace")
    if run.folder is None or not trace or not (Path(run.folder) / trace).is_file():
        return TraceFindings(False, "no trace file in this run")
    path = Path(run.folder) / trace
    try:
        from lmprof.trace.analyze import analyze_path
    except ImportError:
        return TraceFindings(False, "trace analysis unavailable (lmprof.trace.analyze is not installed)")
    try:
        result = analyze_path(path)
    except Exception as exc:  # analysis is optional: a failure there must not cost the report
        return TraceFindings(False, f"trace analysis failed: {type(exc).__name__}: {exc}")
    return findings_from_analysis(result)


def findings_from_analysis(result: Any) -> TraceFindings:
    """Sentences, a figure table and rule facts from an analysis report (lmprof.analyze/1)."""
    data = result.to_dict() if hasattr(result, "to_dict") else result
    leaves: list[tuple[str, Any]] = []
    _flatten(data, "", leaves, depth=0)
    figures = [(k, _cell_value(v)) for k, v in leaves if not _is_finding(k)][:120]
    traces = data.get("traces") if isinstance(data, Mapping) else None
    if not traces:  # an unknown shape: show what there is, derive no facts from guesses
        return TraceFindings(True, None, [str(v) for k, v in leaves if _is_finding(k) and v], figures, {})
    sentences, facts = _describe_trace(traces[0])
    if len(traces) > 1:
        sentences.append(f"{len(traces)} traces (ranks) analysed; figures above are for the first.")
    sentences += [str(n) for n in data.get("notes") or []]
    return TraceFindings(True, None, sentences, figures, facts)


def _describe_trace(t: Mapping[str, Any]) -> tuple[list[str], dict[str, float]]:
    """Plain-language findings and rule facts for one trace of an lmprof.analyze/1 report."""
    out: list[str] = []
    facts: dict[str, float] = {}
    steps = t.get("steps") or {}
    n_steps = steps.get("count") or 0
    if n_steps:
        out.append(f"{n_steps} profiled step(s) in the trace: median {steps.get('median_ms', 0):.3g} ms "
                   f"(min {steps.get('min_ms', 0):.3g}, max {steps.get('max_ms', 0):.3g} ms).")
    ops = t.get("operators") or {}
    if ops.get("count"):
        per = f" ({ops['count'] / n_steps:,.0f} per step)" if n_steps else ""
        if n_steps:
            facts["ops_per_step"] = ops["count"] / n_steps
        top = ", ".join(f"{o['name']} {o['share_pct']:.1f}%" for o in (ops.get("top") or [])[:3])
        out.append(f"{ops['count']:,} CPU operator calls{per}; most self time: {top}.")
    dev = t.get("device")
    if not dev:
        out.append(f"No device timeline ({t.get('device_note') or 'no device activity'}): device idle time, "
                   "launch delays and kernels do not apply to this run.")
        return out, facts
    tmp, idle, launches = dev.get("temporal") or {}, dev.get("idle") or {}, dev.get("launches") or {}
    span = tmp.get("span_us") or 0.0
    if span:
        facts["device_idle_pct"] = float(tmp.get("idle_pct") or 0.0)
        out.append(f"Over {span / 1e3:,.1f} ms of device timeline the device computed {tmp.get('compute_pct', 0):.1f}%, "
                   f"moved memory {tmp.get('memory_pct', 0):.1f}%, communicated {tmp.get('communication_pct', 0):.1f}% "
                   f"and was idle {tmp.get('idle_pct', 0):.1f}% of the time.")
        if idle.get("gaps"):
            sync = 100.0 * (idle.get("sync_us") or 0.0) / span
            host = 100.0 * (idle.get("host_bound_us") or 0.0) / span
            facts["sync_idle_pct"], facts["host_bound_idle_pct"] = sync, host
            out.append(f"Idle gaps: {idle['gaps']}; waiting on a host synchronisation {sync:.1f}% of the timeline "
                       f"({idle.get('sync_gaps', 0)} gaps), host too slow to launch {host:.1f}% "
                       f"({idle.get('host_bound_gaps', 0)} gaps).")
    if launches.get("linked"):
        out.append(f"Median launch delay {launches.get('launch_delay_median_us') or 0:.3g} µs; "
                   f"{launches.get('short_kernels_pct') or 0:.1f}% of kernels ran shorter than the call that launched them.")
    kernels = (dev.get("kernels") or {}).get("top") or []
    if kernels:
        out.append("Top kernels by device time: " + ", ".join(
            f"{k['name'][:60]} {k['share_pct']:.1f}%" for k in kernels[:3]) + ".")
    return out, facts


def _is_finding(path: str) -> bool:
    return any(part in _FINDING_KEYS for part in path.split("."))


def _flatten(obj: Any, prefix: str, out: list[tuple[str, Any]], depth: int) -> None:
    """Scalar leaves of a nested result as (dotted path, value); big collections summarised."""
    if len(out) > 400 or depth > 6:
        return
    if obj is None or isinstance(obj, (str, bool, int, float)):
        out.append((prefix or "value", obj))
        return
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():
        out.append((prefix, obj.item()))  # numpy scalar
        return
    if type(obj).__name__ in ("DataFrame", "Series", "ndarray"):
        out.append((prefix, f"{type(obj).__name__} of {len(obj)} rows"))
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items: Iterable[tuple[str, Any]] = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif hasattr(obj, "model_dump"):
        items = obj.model_dump().items()
    elif isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        if len(obj) > 12 and not all(isinstance(x, str) for x in obj):
            out.append((prefix, f"{len(obj)} items"))
            return
        items = ((str(i), x) for i, x in enumerate(obj))
    else:
        out.append((prefix, str(obj)))
        return
    for k, v in items:
        _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)


def trace_html(tf: TraceFindings) -> str:
    """The trace-analysis section's body."""
    if not tf.available:
        return absent(tf.reason or "trace analysis unavailable")
    parts = []
    if tf.findings:
        parts.append("<ul>" + "".join(f"<li>{esc(f)}</li>" for f in tf.findings) + "</ul>")
    else:
        parts.append('<p class="intro">The analysis reported no findings for this trace.</p>')
    if tf.figures:
        rows = [[f"<code>{esc(k)}</code>", v] for k, v in tf.figures]
        parts.append(f"<details><summary>All {len(rows)} figures from the analysis</summary>"
                     f"{table(['figure', 'value'], rows, num=(1,), cls='kv')}</details>")
    return "".join(parts)


# ================================================================================================
# Sections of the run report
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


def _pngs(run: Run, pred: Callable[[str, str], bool], used: set[str]) -> list[str]:
    """Embedded <figure>s for the run's PNG files whose (role, name) match ``pred``."""
    out = []
    for role, name in run.files.items():
        if not name.lower().endswith(".png") or name in used or not pred(role.lower(), name.lower()):
            continue
        path = Path(run.folder) / name if run.folder else None
        used.add(name)
        if path is None or not path.is_file():
            out.append(absent(f"{name}: listed in run.json but the file is missing"))
            continue
        out.append(figure(path.read_bytes(), f"{name} ({role})"))
    return out


def generic_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Any list of row dicts as a table (columns in first-seen order)."""
    cols: dict[str, None] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k)
    body = []
    for r in rows:
        body.append([_table_cell(c, r.get(c)) for c in cols])
    num = tuple(i for i, c in enumerate(cols) if all(isinstance(r.get(c), (int, float, type(None))) for r in rows))
    return table(list(cols), body, num=num)


# Column-name endings and the unit their numbers are shown in (FLOP/s before FLOP: longest first).
_COLUMN_UNITS = (("flops_per_s", "FLOP/s"), ("bytes_per_s", "B/s"), ("flops", "FLOP"), ("bytes", "B"),
                 ("joules", "J"), ("watts", "W"), ("_w", "W"))


def _table_cell(col: str, v: Any) -> str:
    """A generic table cell, with a unit guessed from the column name (flops, bytes, *_s, *_pct)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (isinstance(v, float) and math.isnan(v)):
        return _cell_value(v)
    c = col.lower()
    for suffix, unit in _COLUMN_UNITS:
        if c.endswith(suffix):
            return esc(number(float(v), unit))
    if c.endswith("_s") or c == "seconds":
        return esc(number(float(v) * 1e3, "ms"))
    if c.endswith(("_pct", "fraction")):
        return esc(f"{100 * v if c.endswith('fraction') else v:.3g} %")
    return _cell_value(v)


def compute_html(run: Run, used: set[str]) -> str:
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


def memory_html(run: Run, used: set[str]) -> str:
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


def kv_html(pairs: Sequence[tuple[str, Any]]) -> str:
    return table(["key", "value"], [[esc(k), _cell_value(v)] for k, v in pairs], cls="kv")


def config_html(config: Mapping[str, Any]) -> str:
    """Set options as a table; options left unset (None) named on one line below it."""
    pairs = _flat_config(config)
    unset = [k for k, v in pairs if v is None]
    line = f'<p class="intro">Not set (defaults apply): {esc(", ".join(unset))}.</p>' if unset else ""
    return kv_html([(k, v) for k, v in pairs if v is not None]) + line


def trace_file_html(run: Run, report_dir: Path) -> str:
    """A relative link to the trace and how to open it."""
    name = run.files.get("trace")
    if not name:
        return absent("no trace file was written by this run")
    path = Path(run.folder) / name if run.folder else Path(name)
    size = f" ({human_bytes(path.stat().st_size)})" if path.is_file() else " (file missing)"
    try:
        href = os.path.relpath(path.resolve(), report_dir.resolve())
    except ValueError:  # different drives on Windows
        href = path.resolve().as_uri()
    return (f'<p><a href="{esc(Path(href).as_posix())}" download>{esc(name)}</a>{esc(size)}: the profiled '
            "steps as a Chrome/Kineto trace.</p>"
            "<p>Open it in Perfetto: go to <code>ui.perfetto.dev</code>, choose <b>Open trace file</b> and pick "
            "this file (it is read in your browser, nothing is uploaded). Or open <code>chrome://tracing</code> "
            "in Chrome and <b>Load</b> it. lmprof's block ranges are the <code>lmprof:*</code> slices.</p>")


def _title(run: Run) -> str:
    c = run.config
    model = c.get("hf") or c.get("model_name") or f"GPT preset {c.get('preset', '?')}"
    return f"lmprof {run.mode} — {model} on {run.env.device} ({run.env.device_name})"


def _config_line(run: Run) -> str:
    c = run.config
    parts = []
    for key, label in (("batch_size", "batch"), ("seq_len", "seq"), ("new_tokens", "new tokens")):
        if c.get(key):
            parts.append(f"{label} {c[key]}")
    for key in ("dtype", "attention", "optimizer"):
        if c.get(key):
            parts.append(str(c[key]))
    parts.append("compiled" if c.get("compile") else "eager")
    parts.append(f"{c.get('steps', '?')} timed, {c.get('warmup', '?')} warm-up, {c.get('profile_steps', '?')} profiled")
    return ", ".join(parts)


def render_run_report(run: Run, report_dir: str | Path | None = None,
                      trace: TraceFindings | None = None) -> str:
    """The run report as an HTML string. ``report_dir`` is where it will live (for relative links)."""
    rdir = Path(report_dir) if report_dir is not None else Path(run.folder or ".")
    tf = trace if trace is not None else trace_findings(run)
    recs = advise(run, tf.facts)
    used: set[str] = set()

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
    header = (f"<h1>{esc(_title(run))}</h1><p class=\"sub\">{esc(_config_line(run))}<br>run "
              f"<code>{esc(run.id)}</code>, recorded {esc(run.created)}</p>")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_run_report(run, report_dir=path.parent), encoding="utf-8")
    return path


# ================================================================================================
# Sweep report
# ================================================================================================


@dataclass(frozen=True)
class Objective:
    """A 'best configuration' criterion over a sweep's result columns (first matching column wins)."""

    title: str
    columns: tuple[str, ...]
    maximize: bool
    unit: str


# Column names as the sweep store writes them (lmprof.record.store.metric_column) and as run keys.
OBJECTIVES = (
    Objective("fastest (tokens/s)", ("tokens_per_s", "decode_tokens_per_s"), True, "tokens/s"),
    Objective("lowest step time", ("step_time_ms", "step_time"), False, "ms"),
    Objective("lowest time to first token", ("ttft_ms", "ttft"), False, "ms"),
    Objective("lowest time per output token", ("tpot_ms", "tpot"), False, "ms"),
    Objective("best MFU", ("mfu_pct", "mfu"), True, "%"),
    Objective("lowest peak memory", ("memory_peak_bytes", "memory.peak"), False, "B"),
    Objective("best energy per token", ("energy_per_token_j", "energy.per_token", "energy_estimated_per_token_j",
                                        "energy.estimated.per_token"), False, "J/token"),
)
_STATUS_COLS = ("status", "state", "outcome")
_OK = {"ok", "success", "succeeded", "done", "completed", "passed"}
_UNFINISHED = {"pending", "running", "queued"}
_REASON_COLS = ("message", "error", "reason", "failure", "error_message")
_ID_COLS = ("label", "run_id", "id", "name", "point")
_CONFIG_HINTS = ("mode", "model", "preset", "batch_size", "seq_len", "dtype", "attention", "compile", "device",
                 "n_layer", "n_head", "n_embd", "optimizer", "kv_cache", "new_tokens", "prompt_len", "hf", "repeat")
_HIDDEN_COLUMNS = ("config", "seq")  # the point as JSON: every field already has its own column
_LINK_COLUMNS = ("run_dir", "folder", "run_folder")
_MAX_COLUMNS = 40


def is_sweep_folder(folder: str | Path) -> bool:
    """A sweep folder: has results.sqlite or plots/, or holds run folders but no run.json itself."""
    p = Path(folder)
    if (p / "run.json").is_file():
        return False
    return (p / "results.sqlite").is_file() or (p / "plots").is_dir() or any(p.glob("*/run.json"))


def load_sweep_table(folder: str | Path) -> tuple[Any, str]:
    """(DataFrame of sweep points or None, where it came from).

    Prefers :func:`lmprof.record.store.load_results`; when that module is missing or refuses the
    file, reads ``results.sqlite`` directly; without a store builds rows from the run folders inside.
    """
    import pandas as pd

    p = Path(folder)
    db = p / "results.sqlite"
    if db.is_file():
        try:
            from lmprof.record.store import load_results
        except ImportError:
            why = "lmprof.record.store is not installed"
        else:
            try:
                return load_results(p), "results.sqlite"
            except DataError as exc:  # not the store's schema: read the file as plain SQLite
                why = str(exc)
        import sqlite3

        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")]
            pick = next((n for n in ("results", "points", "runs") if n in names), names[0] if names else None)
            if pick is not None:
                return pd.read_sql_query(f'SELECT * FROM "{pick}"', con), f"results.sqlite table {pick} ({why})"
    rows = []
    for rj in sorted(p.glob("*/run.json")):
        try:
            run = Run.load(rj)
        except DataError as exc:
            rows.append({"run_id": rj.parent.name, "status": "error", "message": str(exc)})
            continue
        row: dict[str, Any] = {"run_id": run.id, "status": "ok", "mode": run.mode, "run_dir": str(rj.parent)}
        row.update({k: v for k, v in run.config.items() if k in _CONFIG_HINTS})
        row.update({k: m.value for k, m in run.metrics.items()})
        rows.append(row)
    df = pd.DataFrame(rows) if rows else None
    if df is not None:
        df.attrs["units"] = {}
    return df, "run folders"


def _col(df: Any, names: Sequence[str]) -> str | None:
    lower = {str(c).lower(): c for c in df.columns}
    for n in names:
        if n in lower:
            return lower[n]
    return None


def _status(df: Any) -> Any:
    col = _col(df, _STATUS_COLS)
    return None if col is None else df[col].astype(str).str.lower()


def _ok_mask(df: Any) -> Any:
    import pandas as pd

    st = _status(df)
    if st is not None:
        return st.isin(_OK)
    reason = _col(df, _REASON_COLS)
    if reason is not None:
        return df[reason].isna() | (df[reason].astype(str).str.strip() == "")
    return pd.Series(True, index=df.index)


def _failed_mask(df: Any) -> Any:
    st = _status(df)
    if st is None:
        return ~_ok_mask(df)
    return ~st.isin(_OK) & ~st.isin(_UNFINISHED)


def _point_label(df: Any, i: Any) -> str:
    row = df.loc[i]
    ident = _col(df, _ID_COLS)
    who = str(row[ident]) if ident is not None else f"row {i}"
    if ident is not None and str(ident).lower() == "label":
        return who  # the store's label already names the point's axes
    cfg = ", ".join(f"{c}={row[c]}" for c in df.columns if str(c).lower() in _CONFIG_HINTS and not _isna(row[c]))
    return who + (f" ({cfg})" if cfg else "")


def best_points(df: Any) -> list[tuple[Objective, str, float, str, str]]:
    """(objective, column, best value, point label, mode) for every objective with values.

    Training and inference points are never ranked together: with a ``mode`` column, each mode gets
    its own best per objective, from the first of the objective's columns that has values there.
    """
    import pandas as pd

    ok = df[_ok_mask(df)]
    mode_col = _col(ok, ("mode",))
    groups = [(str(m), g) for m, g in ok.groupby(mode_col, sort=False)] if mode_col is not None else [("", ok)]
    out = []
    for mode, group in groups:
        for obj in OBJECTIVES:
            for name in obj.columns:
                col = _col(group, (name,))
                values = pd.to_numeric(group[col], errors="coerce").dropna() if col is not None else None
                if values is None or values.empty:
                    continue
                i = values.idxmax() if obj.maximize else values.idxmin()
                out.append((obj, str(col), float(values[i]), _point_label(group, i), mode))
                break
    return out


def _display_columns(df: Any) -> list[str]:
    """Point name and status, then the objectives' figures, the axes, other figures, the rest."""
    import pandas as pd

    cols = [c for c in df.columns if str(c).lower() not in _HIDDEN_COLUMNS]
    first = [c for c in (_col(df, _ID_COLS), _col(df, _STATUS_COLS)) if c is not None]
    goals = [c for o in OBJECTIVES for c in [_col(df, o.columns)] if c is not None and c not in first]
    axes = [c for c in cols if str(c).lower() in _CONFIG_HINTS and c not in first + goals]
    units = df.attrs.get("units", {}) or {}
    figures = [c for c in cols if c in units and c not in first + goals + axes]
    taken = set(first + goals + axes + figures)
    rest = [c for c in cols if c not in taken]
    # Other numeric columns (durations, attempts) before text (ids, paths, timestamps, messages).
    rest.sort(key=lambda c: not pd.api.types.is_numeric_dtype(df[c]))
    return list(dict.fromkeys(first + goals + axes + figures + rest))[:_MAX_COLUMNS]


def sweep_table_html(df: Any, sweep_dir: Path) -> str:
    """All points in a click-to-sort table (numbers sort numerically by their raw value in data-sort)."""
    import pandas as pd

    units: Mapping[str, str] = df.attrs.get("units", {}) or {}
    cols = _display_columns(df)
    numeric = {c for c in cols if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])}
    head = "".join(f'<th data-type="num" class="num">{esc(c)}</th>' if c in numeric else f"<th>{esc(c)}</th>"
                   for c in cols)
    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = None if _isna(r[c]) else r[c]
            if c in numeric:
                raw = "" if v is None else repr(float(v))
                shown = _cell_value(v, units.get(c)) if units.get(c) not in (None, "count") else _cell_value(v)
                cells.append(f'<td class="num" data-sort="{raw}">{shown}</td>')
            elif str(c).lower() in _LINK_COLUMNS and v:
                cells.append(f"<td>{_folder_link(Path(str(v)), sweep_dir)}</td>")
            else:
                cells.append(f"<td>{_cell_value(v)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    shown_cols = len([c for c in df.columns if str(c).lower() not in _HIDDEN_COLUMNS])
    note = f'<p class="intro">First {_MAX_COLUMNS} of {shown_cols} columns shown.</p>' if shown_cols > _MAX_COLUMNS else ""
    return (f'{note}<div class="scroll"><table class="sortable runs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _folder_link(path: Path, base: Path) -> str:
    """A relative link to a run folder (its report.html when it has one)."""
    target = path if path.is_absolute() else base / path
    if (target / REPORT_NAME).is_file():
        target = target / REPORT_NAME
    try:
        href = Path(os.path.relpath(target.resolve(), base.resolve())).as_posix()
    except ValueError:
        href = target.resolve().as_uri()
    return f'<a href="{esc(href)}">{esc(path.name)}</a>'


def _isna(v: Any) -> bool:
    try:
        return bool(v is None or (isinstance(v, float) and math.isnan(v)))
    except TypeError:
        return False


def render_sweep_report(folder: str | Path) -> str:
    """The sweep report as an HTML string."""
    p = Path(folder)
    df, source = load_sweep_table(p)
    plots = sorted((p / "plots").glob("*.png")) if (p / "plots").is_dir() else []
    plot_html = "".join(figure(f.read_bytes(), f.name) for f in plots) or absent("no plots/*.png in this sweep "
                                                                              "(make them with `lmprof plots`)")
    counts = ""
    if df is None or len(df) == 0:
        table_html = absent("no sweep results found (results.sqlite or run folders)")
        best_html = failed_html = absent("no results")
    else:
        table_html = sweep_table_html(df, p)
        bests = best_points(df)
        best_html = table(
            ["objective", "mode", "best value", "configuration", "column"],
            [[esc(o.title), esc(mode), esc(number(v, o.unit)), esc(label), f"<code>{esc(col)}</code>"]
             for o, col, v, label, mode in bests],
            num=(2,), cls="best",
        ) if bests else absent("none of the objectives (tokens/s, step time, TTFT, TPOT, MFU, peak memory, "
                               "energy per token) is recorded for a successful point of this sweep")
        failed = df[_failed_mask(df)]
        reason_col, status_col = _col(df, _REASON_COLS), _col(df, _STATUS_COLS)
        failed_html = table(
            ["point", "status", "reason"],
            [[esc(_point_label(df, i)), esc(failed.loc[i, status_col] if status_col else "failed"),
              esc(failed.loc[i, reason_col] if reason_col and not _isna(failed.loc[i, reason_col])
                  else "no reason recorded")] for i in failed.index], cls="failed",
        ) if len(failed) else absent("no failed points")
        n_ok = int(_ok_mask(df).sum())
        unfinished = len(df) - n_ok - len(failed)
        counts = (f"{len(df)} points: {n_ok} succeeded, {len(failed)} failed"
                  + (f", {unfinished} not finished" if unfinished else "") + "; ")
    header = (f"<h1>lmprof sweep — {esc(p.resolve().name)}</h1>"
              f"<p class=\"sub\">{esc(counts)}results from {esc(source)}</p>")
    sections = [
        ("best", "Best configuration per objective", best_html, "Among the points that succeeded."),
        ("failed", "Failed points", failed_html, None),
        ("runs", "All points", table_html, "Click a column header to sort; click again to reverse."),
        ("plots", "Plots", plot_html, f"{len(plots)} plot(s) from the sweep's plots/ folder." if plots else None),
    ]
    body = "".join(section(sid, title, b, intro) for sid, title, b, intro in sections)
    return page(f"lmprof sweep — {p.resolve().name}", header, [(s, t) for s, t, _, _ in sections], body, script=True)


def write_sweep_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the sweep report to ``out`` or ``folder/report.html``."""
    path = Path(out) if out is not None else Path(folder) / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_sweep_report(folder), encoding="utf-8")
    return path


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a run folder or a sweep folder (detected) and return its path."""
    p = Path(folder)
    if not p.exists():
        raise DataError(f"no such folder: {p}")
    if is_sweep_folder(p):
        return write_sweep_report(p, out)
    if p.is_dir() and not (p / "run.json").is_file():
        raise DataError(f"{p} is neither a run folder (no run.json) nor a sweep folder "
                        "(no results.sqlite, plots/ or run folders inside)")
    return write_run_report(Run.load(p), p.parent if p.is_file() else p, out=out)


__all__ = [
    "write_run_report", "write_sweep_report", "write_report", "render_run_report", "render_sweep_report",
    "trace_findings", "TraceFindings", "block_chart_png", "is_sweep_folder", "load_sweep_table", "best_points",
]
