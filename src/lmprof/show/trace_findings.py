"""Trace-analysis findings for a run report: what lmprof analyze found in the run's trace, as sentences.

Formats only: the analysis and its facts come from :mod:`lmprof.analysis.trace_facts`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from lmprof.analysis.trace_facts import TraceAnalysis, TraceFacts, analyze_run_trace, trace_analysis
from lmprof.record.run import Run
from lmprof.show.html import Absent, Bullets, Cell, Details, Para, cell_value, table
from lmprof.trace.records import is_record, record_items


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
    """The run's trace analysis (:func:`lmprof.analysis.trace_facts.analyze_run_trace`) as findings."""
    return findings_of(analyze_run_trace(run))


def findings_from_analysis(result: Any) -> TraceFindings:
    """Sentences, a figure table and rule facts from an analysis report (lmprof.analyze/1)."""
    return findings_of(trace_analysis(result))


def findings_of(ta: TraceAnalysis) -> TraceFindings:
    """Sentences, a figure table and the advice facts of a trace analysis."""
    if not ta.available:
        return TraceFindings(False, ta.reason)
    leaves: list[tuple[str, Any]] = []
    _flatten(ta.report, "", leaves, depth=0)
    figures = [(k, cell_value(v)) for k, v in leaves if not _is_finding(k)][:120]
    if ta.facts is None:  # an unknown shape: show what there is, derive no facts from guesses
        return TraceFindings(True, None, [str(v) for k, v in leaves if _is_finding(k) and v], figures, {})
    sentences = describe_trace(ta.facts)
    if ta.traces > 1:
        sentences.append(f"{ta.traces} traces (ranks) analysed; figures above are for the first.")
    sentences += list(ta.notes)
    return TraceFindings(True, None, sentences, figures, ta.facts.for_advice())


def describe_trace(facts: TraceFacts) -> list[str]:
    """Plain-language findings for one trace."""
    out: list[str] = []
    steps, ops = facts.steps, facts.operators
    if steps is not None:
        out.append(f"{steps.count} profiled step(s) in the trace: median {_n(steps.median_ms, '.3g')} ms "
                   f"(min {_n(steps.min_ms, '.3g')}, max {_n(steps.max_ms, '.3g')} ms).")
    if ops is not None:
        per = f" ({ops.per_step:,.0f} per step)" if ops.per_step is not None else ""
        top = ", ".join(f"{o.name} {_n(o.share_pct, '.1f')}%" for o in ops.top[:3])
        out.append(f"{ops.count:,} CPU operator calls{per}; most self time: {top}.")
    dev = facts.device
    if dev is None:
        out.append(f"No device timeline ({facts.device_note or 'no device activity'}): device idle time, "
                   "launch delays and kernels do not apply to this run.")
        return out
    tl, launches = dev.timeline, dev.launches
    if tl is not None:
        out.append(f"Over {tl.span_us / 1e3:,.1f} ms of device timeline the device computed "
                   f"{_n(tl.compute_pct, '.1f')}%, moved memory {_n(tl.memory_pct, '.1f')}%, communicated "
                   f"{_n(tl.communication_pct, '.1f')}% and was idle {_n(tl.idle_pct, '.1f')}% of the time.")
        if tl.idle is not None:
            idle = tl.idle
            out.append(f"Idle gaps: {idle.gaps}; waiting on a host synchronisation {_n(idle.sync_pct, '.1f')}% of the "
                       f"timeline ({_n(idle.sync_gaps, 'd')} gaps), host too slow to launch "
                       f"{_n(idle.host_bound_pct, '.1f')}% ({_n(idle.host_bound_gaps, 'd')} gaps).")
    if launches.graph_launches:
        out.append(f"{launches.graph_launches:,} CUDA-graph launch(es) enqueued {_n(launches.graph_kernels, ',')} "
                   "kernels: this workload already uses CUDA graphs.")
    if launches.linked:
        out.append(f"Median launch delay {_n(launches.delay_median_us, '.3g')} µs; "
                   f"{_n(launches.short_kernels_pct, '.1f')}% of the kernels launched one by one ran shorter "
                   "than the call that launched them.")
    if dev.top_kernels:
        out.append("Top kernels by device time: " + ", ".join(
            f"{k.name[:60]} {_n(k.share_pct, '.1f')}%" for k in dev.top_kernels[:3]) + ".")
    return out


def _n(value: float | None, spec: str) -> str:
    """A figure of the trace analysis as text; n/a when the analysis has none (never 0)."""
    return "n/a" if value is None else format(value, spec)


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
    elif is_record(obj):
        items = record_items(obj)
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


def trace_parts(tf: TraceFindings) -> Sequence[Any]:
    """The trace-analysis section's parts (see :mod:`lmprof.show.html`)."""
    if not tf.available:
        return [Absent(tf.reason or "trace analysis unavailable")]
    parts: list[Any] = [Bullets(tf.findings) if tf.findings
                        else Para("The analysis reported no findings for this trace.", intro=True)]
    if tf.figures:
        rows: list[list[Cell | str]] = [[Cell(k, "code"), v] for k, v in tf.figures]
        parts.append(Details(f"All {len(rows)} figures from the analysis",
                             [table(["figure", "value"], rows, num=(1,), cls="kv")]))
    return parts
