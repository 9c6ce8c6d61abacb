"""Facts a run report and the advice rules take from trace analysis, as typed values.

:func:`analyze_run_trace` runs :mod:`lmprof.trace.analyze` on a run's trace (never raising: a report
must not be lost to its optional trace section); :func:`trace_analysis` reads an analysis result
(a :class:`~lmprof.trace.analyze.Report` or its ``lmprof.analyze/1`` JSON form). The facts are those
of the first trace (rank); :meth:`TraceFacts.for_advice` gives the figures
:func:`lmprof.analysis.advice.advise` reads. Every figure here is read from the trace, or is a
share of the device timeline computed from two of its figures (``*_pct``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lmprof.record.run import Run


@dataclass(frozen=True)
class Share:
    """One named item (operator or kernel) and its share (%) of the time."""

    name: str
    share_pct: float


@dataclass(frozen=True)
class StepFacts:
    """Profiled steps found in the trace; durations in ms."""

    count: int
    median_ms: float
    min_ms: float
    max_ms: float


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
    sync_pct: float  # the host sat in a synchronising call
    host_bound_pct: float  # the host was too slow to launch
    sync_gaps: int
    host_bound_gaps: int


@dataclass(frozen=True)
class TimelineFacts:
    """What the device did over its timeline (span in µs, the rest in % of it)."""

    span_us: float
    compute_pct: float
    memory_pct: float
    communication_pct: float
    idle_pct: float
    idle: IdleFacts | None  # None: the analysis found no idle gaps


@dataclass(frozen=True)
class LaunchFacts:
    """Kernel launches: CUDA-graph launches and the delay of kernels launched one by one."""

    graph_launches: int
    graph_kernels: int
    linked: int  # kernels linked to the runtime call that launched them
    delay_median_us: float
    short_kernels_pct: float  # of linked kernels, those shorter than their launch call


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
        out: dict[str, float] = {}
        if self.operators is not None and self.operators.per_step is not None:
            out["ops_per_step"] = self.operators.per_step
        dev = self.device
        if dev is not None and dev.timeline is not None:
            out["device_idle_pct"] = dev.timeline.idle_pct
            if dev.timeline.idle is not None:
                out["sync_idle_pct"] = dev.timeline.idle.sync_pct
                out["host_bound_idle_pct"] = dev.timeline.idle.host_bound_pct
        if dev is not None and dev.launches.graph_launches:
            out["graph_launches"] = float(dev.launches.graph_launches)
        return out


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
        from lmprof.trace.analyze import analyze_path
    except ImportError:
        return TraceAnalysis(False, "trace analysis unavailable (lmprof.trace.analyze is not installed)")
    try:
        result = analyze_path(path)
    except Exception as exc:  # analysis is optional: a failure there must not cost the report
        return TraceAnalysis(False, f"trace analysis failed: {type(exc).__name__}: {exc}")
    return trace_analysis(result)


def trace_analysis(result: Any) -> TraceAnalysis:
    """The facts of an analysis result: a ``Report`` (anything with ``to_dict``) or its JSON dict."""
    data = result.to_dict() if hasattr(result, "to_dict") else result
    traces = data.get("traces") if isinstance(data, Mapping) else None
    if not traces:
        return TraceAnalysis(True, None, data)
    return TraceAnalysis(True, None, data, trace_facts(traces[0]), len(traces),
                         tuple(str(n) for n in data.get("notes") or []))


def trace_facts(t: Mapping[str, Any]) -> TraceFacts:
    """The facts of one trace of an ``lmprof.analyze/1`` report (missing figures read as absent or 0)."""
    steps = t.get("steps") or {}
    n_steps = int(steps.get("count") or 0)
    step_facts = (StepFacts(n_steps, _f(steps, "median_ms"), _f(steps, "min_ms"), _f(steps, "max_ms"))
                  if n_steps else None)
    ops = t.get("operators") or {}
    n_ops = ops.get("count") or 0
    op_facts = (OperatorFacts(n_ops, n_ops / n_steps if n_steps else None, _shares(ops.get("top")))
                if n_ops else None)
    dev = t.get("device")
    return TraceFacts(step_facts, op_facts, _device_facts(dev) if dev else None, t.get("device_note"))


def _device_facts(dev: Mapping[str, Any]) -> DeviceFacts:
    tmp, idle, launches = dev.get("temporal") or {}, dev.get("idle") or {}, dev.get("launches") or {}
    span = float(tmp.get("span_us") or 0.0)
    timeline = None
    if span:
        gaps = None
        if idle.get("gaps"):
            gaps = IdleFacts(idle["gaps"], 100.0 * _f(idle, "sync_us") / span, 100.0 * _f(idle, "host_bound_us") / span,
                             idle.get("sync_gaps") or 0, idle.get("host_bound_gaps") or 0)
        timeline = TimelineFacts(span, _f(tmp, "compute_pct"), _f(tmp, "memory_pct"), _f(tmp, "communication_pct"),
                                 _f(tmp, "idle_pct"), gaps)
    launch = LaunchFacts(launches.get("graph_launches") or 0, launches.get("graph_kernels") or 0,
                         launches.get("linked") or 0, _f(launches, "launch_delay_median_us"),
                         _f(launches, "short_kernels_pct"))
    return DeviceFacts(timeline, launch, _shares((dev.get("kernels") or {}).get("top")))


def _f(d: Mapping[str, Any], key: str) -> float:
    """A figure of the report; absent or null reads as 0 (the report writes NaN as null)."""
    return float(d.get(key) or 0.0)


def _shares(rows: Any) -> tuple[Share, ...]:
    return tuple(Share(str(r.get("name", "")), _f(r, "share_pct")) for r in rows or [])
