"""Facts a run report and the advice rules take from trace analysis, as typed values.

:func:`analyze_run_trace` runs :mod:`lmprof.trace.analyze` on a run's trace (never raising: a report
must not be lost to its optional trace section); :func:`trace_analysis` reads an analysis result
(a typed :class:`~lmprof.trace.analyze.Report`, its fields read as they are, or its ``lmprof.analyze/1``
JSON form). The facts are those of the first trace (rank); :meth:`TraceFacts.for_advice` gives the
figures :func:`lmprof.analysis.advice.advise` reads. Every figure here is read from the trace, or is
a share of the device timeline computed from two of its figures (``*_pct``); one the report does not
have is None (shown as n/a), never 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lmprof.record.run import Run


@dataclass(frozen=True)
class Share:
    """One named item (operator or kernel) and its share (%) of the time (None: not in the report)."""

    name: str
    share_pct: float | None


@dataclass(frozen=True)
class StepFacts:
    """Profiled steps found in the trace; durations in ms (None: the report has no such figure)."""

    count: int
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class OperatorFacts:
    """CPU operator calls: how many, per profiled step (None without steps), most self time first."""

    count: int
    per_step: float | None
    top: tuple[Share, ...]


@dataclass(frozen=True)
class IdleFacts:
    """Idle gaps of the device timeline and their causes, as % of the timeline span."""

    gaps: int
    sync_pct: float | None  # the host sat in a synchronising call
    host_bound_pct: float | None  # the host was too slow to launch
    sync_gaps: int | None
    host_bound_gaps: int | None


@dataclass(frozen=True)
class TimelineFacts:
    """What the device did over its timeline (span in µs, the rest in % of it)."""

    span_us: float
    compute_pct: float | None
    memory_pct: float | None
    communication_pct: float | None
    idle_pct: float | None
    idle: IdleFacts | None  # None: the analysis found no idle gaps


@dataclass(frozen=True)
class LaunchFacts:
    """Kernel launches: CUDA-graph launches and the delay of kernels launched one by one."""

    graph_launches: int | None
    graph_kernels: int | None
    linked: int | None  # kernels linked to the runtime call that launched them
    delay_median_us: float | None
    short_kernels_pct: float | None  # of linked kernels, those shorter than their launch call


@dataclass(frozen=True)
class DeviceFacts:
    """The device side of a trace."""

    timeline: TimelineFacts | None  # None: an empty timeline span
    launches: LaunchFacts
    top_kernels: tuple[Share, ...]


@dataclass(frozen=True)
class TraceFacts:
    """The facts of one trace (the first rank's)."""

    steps: StepFacts | None  # None: no profiled steps
    operators: OperatorFacts | None  # None: no operator calls
    device: DeviceFacts | None  # None: no device timeline (``device_note`` says why)
    device_note: str | None

    def for_advice(self) -> dict[str, float]:
        """The figures :func:`lmprof.analysis.advice.advise` reads (only those present)."""
        out: dict[str, float | None] = {}
        if self.operators is not None:
            out["ops_per_step"] = self.operators.per_step
        dev = self.device
        if dev is not None and dev.timeline is not None:
            out["device_idle_pct"] = dev.timeline.idle_pct
            if dev.timeline.idle is not None:
                out["sync_idle_pct"] = dev.timeline.idle.sync_pct
                out["host_bound_idle_pct"] = dev.timeline.idle.host_bound_pct
        if dev is not None and dev.launches.graph_launches:
            out["graph_launches"] = float(dev.launches.graph_launches)
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class TraceAnalysis:
    """What trace analysis said about a trace: the report as JSON and the first trace's facts."""

    available: bool
    reason: str | None = None  # why it is not available
    report: Any = None  # the lmprof.analyze/1 dict (or whatever shape was given)
    facts: TraceFacts | None = None  # None: no traces in the report (an unknown shape: no guessing)
    traces: int = 0  # how many traces (ranks) the report holds
    notes: tuple[str, ...] = ()  # the report's own notes


def analyze_run_trace(run: Run) -> TraceAnalysis:
    """Run :mod:`lmprof.trace.analyze` on the run's trace; never raises (the reason is kept instead)."""
    trace = run.files.get("trace")
    if run.folder is None or not trace or not (Path(run.folder) / trace).is_file():
        return TraceAnalysis(False, "no trace file in this run")
    path = Path(run.folder) / trace
    try:
        from lmprof.trace.fanout import analyze_path
    except ImportError:
        return TraceAnalysis(False, "trace analysis unavailable (lmprof.trace.analyze is not installed)")
    try:
        result = analyze_path(path)
    except Exception as exc:  # analysis is optional: a failure there must not cost the report
        return TraceAnalysis(False, f"trace analysis failed: {type(exc).__name__}: {exc}")
    return trace_analysis(result)


def trace_analysis(result: Any) -> TraceAnalysis:
    """The facts of an analysis result: a typed :class:`~lmprof.trace.analyze.Report`, whose fields are
    read as they are, or its ``lmprof.analyze/1`` JSON dict. ``report`` keeps the JSON form (what a
    report shows)."""
    data = result.to_dict() if hasattr(result, "to_dict") else result
    traces = _get(result, "traces")
    if not traces:
        return TraceAnalysis(True, None, data)
    return TraceAnalysis(True, None, data, trace_facts(traces[0]), len(traces),
                         tuple(str(n) for n in _get(result, "notes") or []))


def trace_facts(t: Any) -> TraceFacts:
    """The facts of one trace: a :class:`~lmprof.trace.analyze.TraceReport` or its JSON form. A figure
    the report does not have (absent, null or NaN) stays None: n/a, never 0."""
    steps = _get(t, "steps")
    n_steps = _get(steps, "count") or 0
    step_facts = (StepFacts(int(n_steps), _get(steps, "median_ms"), _get(steps, "min_ms"), _get(steps, "max_ms"))
                  if n_steps else None)
    ops = _get(t, "operators")
    n_ops = _get(ops, "count") or 0
    op_facts = (OperatorFacts(int(n_ops), n_ops / n_steps if n_steps else None, _shares(_get(ops, "top")))
                if n_ops else None)
    dev = _get(t, "device")
    return TraceFacts(step_facts, op_facts, _device_facts(dev) if dev else None, _get(t, "device_note"))


def _device_facts(dev: Any) -> DeviceFacts:
    tmp, idle, launches = _get(dev, "temporal"), _get(dev, "idle"), _get(dev, "launches")
    span = _get(tmp, "span_us")
    timeline = None
    if span:
        gaps = None
        if _get(idle, "gaps"):
            gaps = IdleFacts(int(_get(idle, "gaps")), _pct(_get(idle, "sync_us"), span),
                             _pct(_get(idle, "host_bound_us"), span), _get(idle, "sync_gaps"),
                             _get(idle, "host_bound_gaps"))
        timeline = TimelineFacts(float(span), _get(tmp, "compute_pct"), _get(tmp, "memory_pct"),
                                 _get(tmp, "communication_pct"), _get(tmp, "idle_pct"), gaps)
    launch = LaunchFacts(_get(launches, "graph_launches"), _get(launches, "graph_kernels"), _get(launches, "linked"),
                         _get(launches, "launch_delay_median_us"), _get(launches, "short_kernels_pct"))
    return DeviceFacts(timeline, launch, _shares(_get(_get(dev, "kernels"), "top")))


def _get(obj: Any, key: str) -> Any:
    """A field of a typed record (an attribute) or of its JSON form (a key); None when the object, or
    the figure, is absent, and for NaN (what the JSON form writes as null)."""
    if obj is None:
        return None
    value = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
    return None if isinstance(value, float) and math.isnan(value) else value


def _pct(part: float | None, whole: float) -> float | None:
    return 100.0 * part / whole if part is not None else None


def _shares(rows: Any) -> tuple[Share, ...]:
    return tuple(Share(str(_get(r, "name") or ""), _get(r, "share_pct")) for r in rows or [])
