"""Run every trace analysis on one or many traces and return one typed report.

Entry points: :func:`analyze_path` (a trace file, a folder of per-rank traces, or an lmprof run
folder), :func:`analyze_tables` (already loaded tables) and :func:`analyze_table` (one table).
:meth:`Report.to_dict` gives the JSON documented in docs/trace-analysis.md. Every figure is measured
from the trace; times are microseconds (``*_us``) except step durations (``*_ms``).
"""
from __future__ import annotations

import math
import re
import stat
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import msgspec
import numpy as np

from lmprof.errors import DataError
from lmprof.trace import kinds, load, nesting
from lmprof.trace.annotations import Annotations, annotation_breakdown, module_breakdown
from lmprof.trace.blocks import BlockBreakdown, BlockMap, block_breakdown, preset_for
from lmprof.trace.critical import CriticalPath, critical_path
from lmprof.trace.hardware import HardwareUse, hardware_use
from lmprof.trace.comms import CommMatch, Communication, collectives, match_ranks
from lmprof.trace.groups import distinct
from lmprof.trace.kernels import KernelBreakdown, OperatorBreakdown, kernel_breakdown, operator_breakdown
from lmprof.trace.launches import LaunchStats, launch_links, launch_stats, launching_calls
from lmprof.trace.load import TraceTable, load_trace
from lmprof.trace.nsys import is_nsys, is_nsys_table, load_nsys
from lmprof.trace.opflops import OpFlops, op_flops
from lmprof.trace.opmemory import MemoryReport, memory_report
from lmprof.trace.phases import Phases, phase_split
from lmprof.trace.records import Record, as_dict
from lmprof.trace.steps import StepStats, profiler_steps, step_stats
from lmprof.trace.timeline import (
    IdleCauses,
    Overlap,
    Temporal,
    Window,
    idle_causes,
    select_device,
    temporal_breakdown,
)

if TYPE_CHECKING:  # only a multi-rank report needs these: a single trace's analysis does not import them
    from lmprof.trace.crossrank import CrossRankPath
    from lmprof.trace.ranks import RankComparison, RankRow

SCHEMA = "lmprof.analyze/1"
NO_DEVICE = "no device activity in trace"
TIME_UNITS = "microseconds in *_us fields, milliseconds in *_ms fields; percentages in *_pct fields"
RUN_TRACE = "trace.json.gz"


class DeviceReport(Record, frozen=True):
    """Everything about the device timeline of one rank."""

    window: Window
    temporal: Temporal
    overlap: Overlap
    idle: IdleCauses
    launches: LaunchStats
    kernels: KernelBreakdown
    device_ids: list[int]  # args.device values seen on device events
    communication: Communication | None  # collectives of the window; None without communication kernels
    hardware: HardwareUse  # occupancy, tensor-core share, copy bandwidth of the window


class TraceReport(Record, frozen=True):
    """The analysis of one trace (one rank)."""

    path: str
    rank: int | None  # from distributedInfo
    events: int  # complete events in the trace
    host_span_us: float  # first host event start to last host event end
    device: DeviceReport | None  # None: no device activity (see ``device_note``)
    device_note: str | None
    unsupported_device_events: dict[str, int]  # category -> events of device work not analysed
    operators: OperatorBreakdown
    steps: StepStats | None  # None when there are no ProfilerStep annotations
    critical_path: CriticalPath | None  # per step; None without ProfilerStep annotations
    annotations: Annotations | None = None  # record_function ranges; None without user annotations
    memory: MemoryReport | None = None  # None unless recorded with profile_memory=True
    phases: Phases | None = None  # forward/backward/optimizer per step; None without autograd or optimizer
    modules: Annotations | None = None  # nn.Module tree; None without module events (with_modules + with_stack)
    op_flops: OpFlops | None = None  # per-op FLOPs / bytes from input shapes; None without record_shapes
    device_name: str | None = None  # the trace's deviceProperties[0].name (peaks are looked up by it)
    notes: list[str] = msgspec.field(default_factory=list)  # what loading skipped or repaired
    blocks: BlockBreakdown | None = None  # device time per block from named ranges; None without a block map
    process: int | None = None  # the host process most host events belong to (None: no host events)
    start_us: float | None = None  # first event's start, on the trace's clock (plus baseTimeNanoseconds)
    end_us: float | None = None  # last event's end, same clock
    cycle: int | None = None  # 1, 2, ...: its place among traces of the same process (profiler cycles)


class CycleRanks(Record, frozen=True):
    """The ranks of one profiler cycle compared (see :func:`combine`)."""

    cycle: int
    ranks: RankComparison | None
    collectives: CommMatch | None = None
    cross_rank: CrossRankPath | None = None


class Report(Record, frozen=True):
    """One or many traces; ``ranks`` compares them when there are several."""

    traces: list[TraceReport]
    ranks: RankComparison | None
    # collectives matched across ranks: wait vs transfer per rank (None: fewer than 2 ranks communicate)
    collectives: CommMatch | None = None
    # the ranks' critical paths linked through their collectives (None: fewer than 2 such ranks)
    cross_rank: CrossRankPath | None = None
    # traces of several processes with several profiler cycles each: ranks compared per cycle
    cycles: list[CycleRanks] | None = None
    schema: str = SCHEMA
    source: str = "measured"  # every figure is read from the trace(s)
    notes: list[str] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict: floats rounded to ns (3 decimals of us), NaN as null."""
        d = as_dict(self)
        head = {"schema": d.pop("schema"), "source": d.pop("source"), "time_units": TIME_UNITS}
        return _clean({**head, **d})


def analyze_table(
    table: TraceTable, *, top: int = 10, include_last_step: bool = False, blocks: BlockMap | None = None
) -> TraceReport:
    """All analyses of one trace. Pure function of the table.

    ``blocks``: the block map for :attr:`TraceReport.blocks` (:mod:`lmprof.trace.blocks`); without
    one, an Nsight Systems export gets the first built-in preset its NVTX ranges match, if any.

    Two threads share the work (most of it is in numpy, which lets the other thread run meanwhile):
    a second thread nests the host events (:func:`nesting.parents`) while this one links kernels to
    their launching calls and finds the steps; then the second walks the critical path while this one
    runs the device analyses, and both take the host analyses from one queue until it is empty. On the
    1.3 M-event trace: about 0.40 s in one thread, 0.25 s so (two cores).
    """
    ev = table.event_cols
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmprof-analyze") as pool:
        nested = pool.submit(nesting.parents, table)
        launching_calls(table)  # kept for the analyses that need only the launching calls
        profiler_steps(table)
        unsupported = kinds.unsupported_device_events(table)
        sel = select_device(table, include_last_step)
        # queued behind the nesting, in the second thread
        critical_done = pool.submit(critical_path, table, sel.rows if sel is not None else None)
        host_tasks = deque(_host_tasks(table, top))
        host_figures: dict[str, Any] = {}
        side_done = pool.submit(_drain, host_tasks, host_figures)
        try:
            # these need only the launching calls (hardware use not even those): they run while the
            # nesting is still going
            early = (temporal_breakdown(table, sel), idle_causes(table, sel),
                     hardware_use(table, sel.rows)) if sel is not None else None
            nested.result()
            launch_links(table)  # each kernel's enclosing operator: the analyses below read it
            device = None
            if sel is not None and early is not None:
                (temporal, overlap), idle, hardware = early
                dev_ids = ev["device"][sel.rows]
                device = DeviceReport(
                    window=sel.window,
                    temporal=temporal,
                    overlap=overlap,
                    idle=idle,
                    launches=launch_stats(table, sel.rows),
                    kernels=kernel_breakdown(table, sel.rows, top),
                    device_ids=sorted(int(d) for d in distinct(dev_ids[dev_ids >= 0])),
                    communication=collectives(table, sel.rows),
                    hardware=hardware,
                )
            _drain(host_tasks, host_figures)
            bmap = blocks if blocks is not None else preset_for(table) if is_nsys_table(table) else None
            block_rows = block_breakdown(table, sel, bmap, include_last_step) if bmap else None
        except BaseException:
            host_tasks.clear()  # the other thread stops after its current analysis
            raise
        critical = critical_done.result()
        side_done.result()
    notes = list(table.notes)
    device_note = None if device else NO_DEVICE
    if unsupported:
        found = ", ".join(f"{n:,} {c}" for c, n in sorted(unsupported.items()))
        what = f"found device events lmprof does not analyse ({found})"
        if device is None:
            device_note = f"no supported device activity in trace: {what}; host figures only"
        else:
            notes.append(f"{what}: left out of the device figures")
    start_us, end_us = _clock_span(table)
    return TraceReport(
        path=table.path,
        rank=table.rank,
        events=len(ev),
        device=device,
        device_note=device_note,
        unsupported_device_events=unsupported,
        critical_path=critical,
        device_name=device_name(table),
        notes=notes,
        blocks=block_rows,
        process=host_process(table),
        start_us=start_us,
        end_us=end_us,
        **host_figures,
    )


def host_process(table: TraceTable) -> int | None:
    """The process id most host events carry (the Nsight Systems export's process); None without any."""
    if table.meta.get("process") is not None:
        return int(table.meta["process"])
    pid = table.event_cols["pid"][kinds.host_mask(table)]
    pid = pid[pid >= 0]  # text ids ("Spans") have negative codes
    if pid.size == 0:
        return None
    values, counts = np.unique(pid, return_counts=True)
    return int(values[np.argmax(counts)])


def _clock_span(table: TraceTable) -> tuple[float | None, float | None]:
    """The trace's first start and last end, offset by baseTimeNanoseconds when the trace has it
    (Kineto writes times relative to it), so that traces of one process compare."""
    ts = table.event_cols["ts"]
    if ts.size == 0:
        return None, None
    base = table.meta.get("baseTimeNanoseconds")
    offset = base / 1e3 if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 2**63 else 0.0
    return float(ts.min()) + offset, float(table.ends().max()) + offset


def _host_tasks(table: TraceTable, top: int) -> list[tuple[str, Callable[[], Any]]]:
    """The analyses of the host's events, as (TraceReport field, analysis), the longest first."""
    return [
        ("annotations", lambda: annotation_breakdown(table)),
        ("phases", lambda: phase_split(table)),
        ("operators", lambda: operator_breakdown(table, top)),
        ("host_span_us", lambda: host_span(table)),
        ("steps", lambda: step_stats(table)),
        ("memory", lambda: memory_report(table, top)),
        ("modules", lambda: module_breakdown(table)),
        ("op_flops", lambda: op_flops(table, top)),
    ]


def _drain(tasks: deque[tuple[str, Callable[[], Any]]], into: dict[str, Any]) -> None:
    """Run tasks from the shared queue until it is empty (``popleft`` is atomic: no task runs twice)."""
    while True:
        try:
            field, task = tasks.popleft()
        except IndexError:
            return
        into[field] = task()


def host_span(table: TraceTable) -> float:
    """Microseconds from the first host event's start to the last one's end (0 without any)."""
    ev = table.event_cols
    host = kinds.host_mask(table)
    if not host.any():
        return 0.0
    ts = ev["ts"][host]
    return float((ts + table.durations()[host]).max() - ts.min())


def device_name(table: TraceTable) -> str | None:
    """The first device's name in the trace's ``deviceProperties`` (Kineto writes it for GPU traces)."""
    props = table.meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        if isinstance(name, str) and name.strip():
            return name.strip()[:200]
    return None


def analyze_tables(
    tables: Iterable[TraceTable], *, top: int = 10, include_last_step: bool = False, blocks: BlockMap | None = None
) -> Report:
    """Analyse each table; with several, compare them as the ranks of one job."""
    reports = [analyze_table(t, top=top, include_last_step=include_last_step, blocks=blocks) for t in tables]
    return combine(reports)


def rank_row(report: TraceReport, rank: int) -> RankRow:
    """Headline figures of one rank's report."""
    from lmprof.trace.ranks import RankRow

    dev = report.device
    t = dev.temporal if dev else None
    return RankRow(
        rank=rank,
        step_ms=report.steps.median_ms if report.steps else None,
        steps=report.steps.count if report.steps else 0,
        span_us=t.span_us if t else None,
        compute_us=t.compute_us if t else None,
        communication_us=t.communication_us if t else None,
        communication_total_us=dev.overlap.communication_total_us if dev else None,
        memory_us=t.memory_us if t else None,
        idle_us=t.idle_us if t else None,
        idle_pct=t.idle_pct if t else None,
        host_span_us=report.host_span_us,
    )


def combine(reports: list[TraceReport]) -> Report:
    """Wrap per-trace reports into a :class:`Report`, comparing ranks when there are several.

    Traces are ranks only where they say so: several traces of one process (same
    ``distributedInfo`` rank, or none, and same host process id) one after another in time are
    successive profiler cycles (``tensorboard_trace_handler`` writes one file per cycle), numbered
    in ``cycle`` and never compared as ranks. With several processes that each have several cycles,
    the ranks are compared per cycle (``Report.cycles``).
    """
    cycles = _cycles(reports)
    if cycles is None:
        return _ranks_report(reports)
    reports = [msgspec.structs.replace(r, cycle=c) for r, c in zip(reports, cycles)]
    processes = {(r.rank, r.process) for r in reports}
    if len(processes) == 1:
        note = (f"{len(reports)} traces of one process (pid {reports[0].process}): successive profiler cycles "
                "(tensorboard_trace_handler writes one file per cycle), analysed per cycle, not compared as ranks")
        return Report(traces=reports, ranks=None, notes=[note])
    note = (f"{len(reports)} traces of {len(processes)} processes, up to {max(cycles)} profiler cycles each "
            "(one file per cycle): ranks compared within each cycle")
    per_cycle = []
    for c in sorted(set(cycles)):
        mine = _ranks_report([r for r in reports if r.cycle == c])
        per_cycle.append(CycleRanks(cycle=c, ranks=mine.ranks, collectives=mine.collectives,
                                    cross_rank=mine.cross_rank))
    order = sorted(range(len(reports)), key=lambda i: (reports[i].cycle or 0, reports[i].rank or 0))
    return Report(traces=[reports[i] for i in order], ranks=None, cycles=per_cycle, notes=[note])


def _cycles(reports: list[TraceReport]) -> list[int] | None:
    """Each trace's cycle number within its process, or None when no process has two traces that
    follow one another in time (two traces of one process that overlap are not cycles)."""
    if len(reports) < 2:
        return None
    by_process: dict[tuple[int | None, int | None], list[int]] = {}
    for i, r in enumerate(reports):
        if r.process is not None:
            by_process.setdefault((r.rank, r.process), []).append(i)
    out = [1] * len(reports)
    found = False
    for members in by_process.values():
        if len(members) < 2:
            continue
        spans = sorted(members, key=lambda i: (reports[i].start_us or 0.0, i))
        for a, b in zip(spans, spans[1:]):
            ra, rb = reports[a], reports[b]
            if ra.start_us is None or ra.end_us is None or rb.start_us is None or rb.start_us < ra.end_us:
                return None  # overlapping traces of one process: the same trace twice, not cycles
        for k, i in enumerate(spans):
            out[i] = k + 1
        found = True
    return out if found else None


def _ranks_report(reports: list[TraceReport]) -> Report:
    notes: list[str] = []
    if len(reports) < 2:
        return Report(traces=reports, ranks=None, notes=notes)
    found = [r.rank for r in reports]
    ranks: list[int] = [r for r in found if r is not None]
    if len(ranks) < len(found):
        notes.append("some traces have no distributedInfo rank: ranks numbered by file order (an export's processes by id)")
        ranks = list(range(len(reports)))
    elif len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise DataError(f"several traces claim rank {dup[0]}: give one trace per rank")
    from lmprof.trace.crossrank import cross_rank_path
    from lmprof.trace.ranks import compare_ranks

    order = sorted(range(len(reports)), key=lambda i: ranks[i])
    reports = [reports[i] for i in order]
    rows = [rank_row(reports[k], ranks[i]) for k, i in enumerate(order)]
    comms = [(ranks[i], r.device.communication if r.device else None) for r, i in zip(reports, order)]
    matched = match_ranks(comms)
    linked = cross_rank_path([(q, r.critical_path, c) for (q, c), r in zip(comms, reports)])
    return Report(traces=reports, ranks=compare_ranks(rows), notes=notes, collectives=matched, cross_rank=linked)


_RANK_DIR = re.compile(r"rank(\d{1,7})")
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".qdrep")


def find_traces(path: str | Path, notes: list[str] | None = None) -> list[Path]:
    """Trace files named by ``path``: the file itself, a run folder's trace, or a folder's traces.

    Only regular files are taken (a FIFO or a device is refused before anything opens it). In a
    distributed run folder, only ``rank<N>/`` folders count; others are left out with a note
    appended to ``notes``. A folder's traces are its Kineto JSON files and Nsight Systems exports
    (``.sqlite``, ``.nsys-rep`` unless the same name's ``.sqlite`` is there too).
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"not found: {p}") from None
    except OSError as exc:
        raise DataError(f"cannot read {p}: {exc.strerror}") from None
    if stat.S_ISREG(mode):
        return [p]
    if not stat.S_ISDIR(mode):
        load.open_regular(p)  # raises the DataError that names what it is
    if (p / "run.json").is_file() or (p / RUN_TRACE).is_file():
        if (p / RUN_TRACE).is_file():
            return [p / RUN_TRACE]
        ranked, odd = [], []
        for d in sorted(p.glob("rank*")):
            m = _RANK_DIR.fullmatch(d.name)
            if m and (d / RUN_TRACE).is_file():
                ranked.append((int(m.group(1)), d / RUN_TRACE))
            elif d.is_dir():
                odd.append(d.name)
        if odd and notes is not None:
            notes.append(f"left out folder(s) not named rank<N> or without {RUN_TRACE}: {', '.join(odd[:5])}")
        if ranked:  # a distributed run: one trace per rank
            return [f for _, f in sorted(ranked)]
        if odd:
            raise DataError(f"{p} is an lmprof run folder with no rank<N>/{RUN_TRACE} (found: {', '.join(odd[:5])})")
        raise DataError(f"{p} is an lmprof run folder without {RUN_TRACE} (no profiled phase recorded)")
    try:
        files = sorted(
            f
            for f in p.iterdir()
            if f.is_file() and f.name.lower().endswith(TRACE_SUFFIXES) and f.name != "run.json"
        )
    except OSError as exc:
        raise DataError(f"cannot list {p}: {exc.strerror}") from None
    exported = {f.name.lower().rsplit(".", 1)[0] for f in files if f.name.lower().endswith(".sqlite")}
    files = [f for f in files if not (f.name.lower().endswith((".nsys-rep", ".qdrep"))
                                      and f.name.lower().rsplit(".", 1)[0] in exported)]
    if not files:
        raise DataError(f"no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep) in {p}")
    return files


def load_tables(path: str | Path) -> list[TraceTable]:
    """The tables of one trace file, by what the file is: a Kineto JSON trace gives one, an Nsight
    Systems export (SQLite, or ``.nsys-rep`` through ``nsys``) one per process. Flow events are not
    kept (no analysis reads them)."""
    p = Path(path)
    if is_nsys(p):
        return load_nsys(p)
    return [load_trace(p, flows=False)]


def json_ready(x: Any) -> Any:
    """``x`` with floats rounded to 3 decimals (NaN and inf as None), numpy scalars as Python ones."""
    return _clean(x)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        f = float(x)
        return None if not math.isfinite(f) else round(f, 3)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, int) and not isinstance(x, bool) and not -(2**63) <= x < 2**64:
        return str(x)  # JSON readers (and orjson) stop at 64 bits: keep the digits as text
    return x
