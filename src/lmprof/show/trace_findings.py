"""Trace-analysis findings for a run report: what lmprof analyze found in the run's trace, as sentences."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from lmprof.record.run import Run
from lmprof.show.html import cell_value, absent, esc, table


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
    figures = [(k, cell_value(v)) for k, v in leaves if not _is_finding(k)][:120]
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
    if launches.get("graph_launches"):
        facts["graph_launches"] = float(launches["graph_launches"])
        out.append(f"{launches['graph_launches']:,} CUDA-graph launch(es) enqueued {launches.get('graph_kernels', 0):,} "
                   "kernels: this workload already uses CUDA graphs.")
    if launches.get("linked"):
        out.append(f"Median launch delay {launches.get('launch_delay_median_us') or 0:.3g} µs; "
                   f"{launches.get('short_kernels_pct') or 0:.1f}% of the kernels launched one by one ran shorter "
                   "than the call that launched them.")
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


