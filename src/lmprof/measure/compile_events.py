"""What torch.compile did during a run: compilations, recompilations and graph breaks, with reasons.

Read from dynamo's own records, never from its log text: ``torch._dynamo.utils.get_compilation_metrics``
gives one :class:`CompilationMetrics` per compiled frame (function, file, line, the guard that failed
for a recompilation, the graph-break reason that restarted the trace, compile seconds), and
``torch._dynamo.utils.counters["graph_break"]`` counts graph breaks by reason. A
:class:`CompileWatch` takes the records that appear while a run is in each phase (warm-up, measured,
profiled), so a run that keeps recompiling after warm-up can be told from one that compiled once.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lmprof.record.catalogue import (
    COMPILE_AFTER_WARMUP, COMPILE_COMPILATIONS, COMPILE_DYNAMO_TIME, COMPILE_GRAPH_BREAKS, COMPILE_PER_STEP,
    COMPILE_RECOMPILES, COMPILE_TIME,
)
from lmprof.record.run import Metric

if TYPE_CHECKING:
    from lmprof.measure.compiled_kernels import KernelRecorder



def _dynamo_utils() -> Any:
    # Imported on first use: torch._dynamo pulls in sympy and most of inductor (seconds of start-up),
    # and a run without --compile never needs it.
    from torch._dynamo import utils

    return utils


# Dynamo names the function that resumes after a graph break ``torch_dynamo_resume_in_<fn>_at_<line>``:
# its line is where the break happened.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
# Keep this many records per run (dynamo's default keeps 64, too few for a run that recompiles a lot).
_RECORDS_KEPT = 4096
MEASURED = "measured"
#: Recompilations per step after warm-up from which a run counts as recompiling every step.
RECOMPILES_PER_STEP_FLAG = 0.5


def short_reason(text: str | None) -> str:
    """The first line of a dynamo reason plus its 'Explanation:' line (the rest is hints)."""
    if not text:
        return ""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    expl = next((ln for ln in lines[1:] if ln.startswith("Explanation:")), "")
    return f"{head}: {expl.removeprefix('Explanation:').strip()}" if expl else head


# Dynamo's records as they were (the objects themselves, held: a record dynamo drops from its bounded
# deque is freed, and a new record could take its address, and so its id) and the graph-break counts.
Baseline = tuple[list[Any], Counter[str]]


def baseline(load: bool = False) -> Baseline:
    """Dynamo's records and graph-break counts as they are now, for a watch started later. Without
    ``load``, nothing is imported: when torch._dynamo was never loaded, nothing was compiled yet."""
    import sys

    if not load and "torch._dynamo.utils" not in sys.modules:
        return [], Counter()
    utils = _dynamo_utils()
    return list(utils.get_compilation_metrics()), Counter(utils.counters["graph_break"])


@dataclass
class CompileEvent:
    """One compilation dynamo recorded: what was compiled, why, where and how long it took."""

    compile_id: str
    kind: str  # "compile" (first time), "recompile" (a guard failed) or "backward" (AOT backward graph)
    phase: str  # the run phase it happened in: warm-up, measured, profiled
    function: str
    where: str  # file:line of the function (or of the graph break for a resumed frame)
    reason: str  # the failed guard (recompile) or the graph-break reason that split the frame
    graph_break: bool
    time_s: float | None
    # For a frame resumed after a graph break: the code it resumes (dynamo's own name for it).
    resumes: str = ""
    graph_ops: int | None = None  # operators in the graph this compilation produced (None or 0: no graph)
    file: str = ""  # the frame's code: its file and first line (where may move to a break's line)
    first_line: int = 0

    def to_row(self) -> dict[str, Any]:
        """A JSON-friendly row for run.tables["compile"]."""
        row = asdict(self)
        for key in ("resumes", "file", "first_line"):
            row.pop(key)
        return row

    @property
    def break_line(self) -> int:
        """The line a resumed frame starts after (0 for any other frame)."""
        return int(self.where.rsplit(":", 1)[1]) if self.resumes and self.where[-1:].isdigit() else 0


def _event(m: Any, phase: str) -> CompileEvent:
    secs = m.duration_us / 1e6 if m.duration_us is not None else m.entire_frame_compile_time_s
    if m.is_forward is False:
        return CompileEvent(str(m.compile_id), "backward", phase, "(backward graph)", "", "", False, secs,
                            graph_ops=getattr(m, "graph_op_count", None))
    name = m.co_name or "?"
    where = f"{m.co_filename}:{m.co_firstlineno}" if m.co_filename else ""
    resumed = _RESUME.match(name)
    resumes = ""
    if resumed:  # a frame that starts right after a graph break: its line is the break's
        resumes = resumed["fn"]
        where = f"{m.co_filename}:{resumed['line']}"
    breaks = sorted(m.restart_reasons or ())
    if m.recompile_reason:
        kind, reason = "recompile", short_reason(m.recompile_reason)
    else:
        kind, reason = "compile", ""
    if breaks:
        reason = "; ".join(filter(None, [reason, *(f"graph break: {short_reason(b)}" for b in breaks)]))
    return CompileEvent(str(m.compile_id), kind, phase, name, where, reason, bool(breaks), secs, resumes,
                        graph_ops=getattr(m, "graph_op_count", None), file=m.co_filename or "",
                        first_line=m.co_firstlineno or 0)


def _place_breaks(events: list[CompileEvent]) -> None:
    """Give each graph break the line it happened on: that of the frame dynamo resumed after it.

    A frame that broke is compiled with the break's reason; the code after the break runs as a new
    frame, compiled next, whose name carries the break's line.
    """
    for i, e in enumerate(events):
        if not e.graph_break:
            continue
        after = next((r for r in events[i + 1:] if r.resumes == e.function), None)
        if after is not None:
            e.where = after.where


@dataclass
class CompileWatch:
    """Collects dynamo's compilation records per run phase; call :meth:`phase` as the run moves on."""

    current: str = "warm-up"
    events: list[CompileEvent] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)
    first_call_s: float | None = None
    _seen: dict[int, Any] = field(default_factory=dict)  # id -> the record, held so its id stays its own
    _breaks_before: Counter[str] = field(default_factory=Counter)
    _kernels: KernelRecorder | None = None

    @classmethod
    def start(cls, phase: str = "warm-up", *, since: "Baseline | None" = None) -> "CompileWatch":
        """Begin watching: records already there (earlier runs in this process) are not this run's.
        ``since``: a :func:`baseline` taken earlier, when the run began before its model was known to
        be compiled (``lmprof run`` learns it at the first optimizer step, after that step compiled):
        records made since then are the run's, in ``phase``."""
        from lmprof.measure.compiled_kernels import KernelRecorder

        dynamo_utils = _dynamo_utils()
        dynamo_utils.set_compilation_metrics_limit(_RECORDS_KEPT)
        watch = cls(current=phase)
        records, watch._breaks_before = since if since is not None else baseline(load=True)
        watch._seen = {id(m): m for m in records}
        # Open for the whole run: a recompilation in the profiled phase must name its kernels too.
        watch._kernels = KernelRecorder().__enter__()
        return watch

    def kernel_graphs(self) -> list[dict[str, Any]]:
        """The compiled graphs' kernels with their blocks (measure/compiled_kernels.py)."""
        return self._kernels.graphs() if self._kernels else []

    def _harvest(self) -> None:
        for m in _dynamo_utils().get_compilation_metrics():
            if id(m) not in self._seen:
                self._seen[id(m)] = m
                self.events.append(_event(m, self.current))

    def phase(self, name: str) -> None:
        """Close the current phase (its records are taken now) and start ``name``."""
        self._harvest()
        self.current = name

    def count(self, name: str, steps: int) -> None:
        """``steps`` calls ran in phase ``name`` (the measured window's count decides the alarm)."""
        self.steps[name] = self.steps.get(name, 0) + steps

    def finish(self) -> "CompileReport":
        """Take the last phase's records; the report of the whole run."""
        self._harvest()
        graphs = self.kernel_graphs()
        if self._kernels is not None:
            self._kernels.__exit__(None, None, None)
            self._kernels = None
        _place_breaks(self.events)
        breaks = Counter(_dynamo_utils().counters["graph_break"])
        breaks.subtract(self._breaks_before)
        return CompileReport(list(self.events), dict(self.steps), self.first_call_s,
                             {short_reason(k): v for k, v in breaks.items() if v > 0}, graphs)


@dataclass
class CompileReport:
    """A run's compile events and the figures drawn from them."""

    events: list[CompileEvent]
    steps: dict[str, int]  # calls made in each counted phase (the measured window)
    first_call_s: float | None
    graph_break_hits: dict[str, int]  # graph breaks dynamo met while tracing, by reason
    kernel_graphs: list[dict[str, Any]] = field(default_factory=list)  # compiled_kernels.json

    @property
    def recompiles(self) -> list[CompileEvent]:
        return [e for e in self.events if e.kind == "recompile"]

    @property
    def graph_break_sites(self) -> list[tuple[str, str]]:
        """Distinct (where, reason) of the places the compiled code is split into graphs.

        torch._dynamo.explain's rule, graphs minus one per compiled call: a function compiled on its own
        (first compilations only: a recompilation traces the same code again) and the frames dynamo
        resumed it in after its breaks are one chain, each graph with operators after the chain's first
        begins at a split, and a chain compiled while another was broken open (a function its code
        called after a break) splits that one once more. A frame that restarted its analysis is no split
        by itself (a break before any operator, or a restart that is no break, e.g. to specialize a
        float, leaves one graph), and a data-dependent branch splits the graph without a restart
        recorded; both used to be counted the other way round."""
        sites: set[tuple[str, str]] = set()
        chains = self._chains()
        spans = [(c[0][0], c[-1][0]) for c in chains]
        for chain in chains:
            graphs = [e for _, e in chain if e.graph_ops]
            sites.update((e.where, self._split_reason(e)) for e in graphs[1:])
            start = chain[0][0]
            if graphs and any(a < start < b for a, b in spans):  # compiled inside another chain's break
                sites.add((graphs[0].where, self._split_reason(graphs[0])))
        return sorted(sites)

    def _chains(self) -> list[list[tuple[int, CompileEvent]]]:
        """First compilations grouped by the function compiled on its own (index, event) in compile
        order: a resumed frame joins the latest chain of its function, file and lines around it."""
        first = [(i, e) for i, e in enumerate(self.events) if e.kind == "compile"]
        chains: dict[int, list[tuple[int, CompileEvent]]] = {}
        for i, e in first:
            owner = None
            if e.resumes:
                roots = [j for j in chains if (r := self.events[j]).function == e.resumes and r.file == e.file
                         and r.first_line <= e.break_line]
                owner = max(roots, key=lambda j: (self.events[j].first_line, j), default=None)
            chains.setdefault(i if owner is None else owner, []).append((i, e))
        return list(chains.values())

    def _split_reason(self, graph: CompileEvent) -> str:
        """Why the code before ``graph`` left the graph: the break its frame recorded, if any."""
        if graph.resumes:
            broke = next((e for e in self.events if e.graph_break and e.kind != "backward"
                          and (e.function == graph.resumes or e.resumes == graph.resumes)), None)
            if broke is not None:
                return broke.reason
            return "graph break: dynamo recorded no reason (data-dependent control flow, for one)"
        return "graph break: a frame compiled on its own (its caller broke the graph to call it)"

    def after_warmup(self) -> list[CompileEvent]:
        """Compilations after warm-up: each one is a stall inside the timed or profiled window."""
        return [e for e in self.events if e.phase != "warm-up" and e.kind != "backward"]

    def per_step(self, phase: str = MEASURED) -> float | None:
        """Forward compilations per call in ``phase`` (None when its calls were not counted)."""
        n = self.steps.get(phase)
        hits = [e for e in self.events if e.phase == phase and e.kind != "backward"]
        return len(hits) / n if n else None

    def recompiles_every_step(self) -> bool:
        """True when the run kept compiling after warm-up at about one compilation per step or more."""
        rate = self.per_step()
        return rate is not None and rate >= RECOMPILES_PER_STEP_FLAG

    def metrics(self) -> dict[str, Metric]:
        """compile.* figures for run.json."""
        src = "torch._dynamo compilation metrics"
        total = sum(e.time_s or 0.0 for e in self.events)
        out = {
            COMPILE_COMPILATIONS: Metric(value=len(self.events), unit="count", source="measured",
                                         note=f"frames compiled, backward graphs included ({src})"),
            COMPILE_RECOMPILES: Metric(value=len(self.recompiles), unit="count", source="measured",
                                       note=f"compilations caused by a failed guard ({src})"),
            COMPILE_GRAPH_BREAKS: Metric(value=len(self.graph_break_sites), unit="count", source="measured",
                                         note=f"distinct places the graph is split ({src})"),
            COMPILE_AFTER_WARMUP: Metric(value=len(self.after_warmup()), unit="count", source="measured",
                                         note="compilations in the measured and profiled windows"),
            COMPILE_DYNAMO_TIME: Metric(value=total * 1e3, unit="ms", source="measured",
                                        note=f"compile time dynamo recorded, all frames and backward graphs ({src})"),
        }
        rate = self.per_step()
        if rate is not None:
            out[COMPILE_PER_STEP] = Metric(value=rate, unit="compilations/step", source="derived",
                                           note="forward compilations per timed call after warm-up")
        if self.first_call_s is not None:
            out[COMPILE_TIME] = Metric(
                value=self.first_call_s * 1e3, unit="ms", source="measured",
                note="the first call (step or generation), compilation included, by stopwatch; "
                     "warm-up absorbs it, so the clean figures are steady state")
        return out

    def notes(self) -> list[str]:
        """Lines for run.notes: graph breaks and recompilations, with the reasons."""
        out: list[str] = []
        for where, reason in self.graph_break_sites:
            out.append(f"torch.compile graph break at {where}: {reason}")
        if self.recompiles_every_step():
            hits = [e for e in self.after_warmup() if e.phase == MEASURED]
            first = next((e for e in hits if e.reason), None)
            why = f" (e.g. {first.reason})" if first else ""
            out.append(f"torch.compile compiled {len(hits)} times in {self.steps[MEASURED]} timed calls: it "
                       f"recompiles every step{why}; the timed figures include compilation")
        elif self.after_warmup():
            out.append(f"torch.compile compiled {len(self.after_warmup())} times after warm-up; "
                       "those calls include compilation")
        return out

    def rows(self) -> list[dict[str, Any]]:
        """run.tables["compile"]: one row per compilation."""
        return [e.to_row() for e in self.events]
