"""Terminal tables for ``lmprof analyze`` (rich). Reads a :class:`~lmprof.trace.analyze.Report` only."""
from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lmprof.analysis.block_flops import BlockFlops
from lmprof.analysis.op_roofline import OpRoofline
from lmprof.trace.analyze import CycleRanks, DeviceReport, Report, TraceReport
from lmprof.trace.annotations import Annotations
from lmprof.trace.diff import KINDS, DiffReport
from lmprof.trace.ranks import RankComparison, RankRow
from lmprof.trace.snapshot import SnapshotReport
from lmprof.units import si

_MAX_NAME = 72
_MAX_ROWS = 40  # annotation rows shown; all of them in --json
_DETAILED_RANKS = 4  # beyond this many traces only the rank table is printed
_RANK_ROWS = 16  # beyond this many ranks the table shows the slowest and the fastest


def render(
    report: Report,
    console: Console | None = None,
    rooflines: list[OpRoofline | None] | None = None,
    block_flops: list[BlockFlops | None] | None = None,
    memory_sort: str = "inclusive",
) -> None:
    """Print the report as tables; several traces get a rank comparison first. ``rooflines``: each
    trace's per-op roofline (:func:`lmprof.analysis.op_roofline.op_roofline`), when a device is known;
    ``block_flops``: each trace's FLOPs per block (``--model``); ``memory_sort``: the memory table's
    ranking, "inclusive" or "self" (see lmprof.trace.opmemory)."""
    con = console or Console(highlight=False)
    for note in report.notes:
        con.print(f"note: {escape(note)}")
    if report.ranks is not None:
        _ranks(con, report)
    for cyc in report.cycles or []:
        if cyc.ranks is not None:
            _ranks(con, cyc, f"cycle {cyc.cycle}: ")
    if len(report.traces) > _DETAILED_RANKS:
        con.print(f"{len(report.traces)} traces: per-rank details with --json")
        return
    for i, tr in enumerate(report.traces):
        _trace(con, tr, rooflines[i] if rooflines and i < len(rooflines) else None,
               block_flops[i] if block_flops and i < len(block_flops) else None, memory_sort)


def short_name(name: str, limit: int = _MAX_NAME) -> str:
    """A readable kernel / operator name: no return type, arguments folded to (…), template
    arguments kept one level deep (they tell instances apart) with deeper levels folded to <…>."""
    s = name[5:] if name.startswith("void ") else name
    out: list[str] = []
    angle = paren = 0
    for ch in s:
        if paren:  # inside a top-level argument list: skip it
            paren += ch == "("
            paren -= ch == ")"
            continue
        if ch == "(" and angle == 0 and out and out[-1][-1:] not in (" ", ""):  # an argument list
            out.append("(…)")
            paren = 1
        elif ch == "<":
            angle += 1
            if angle <= 2:
                out.append("<" if angle == 1 else "<…>")
        elif ch == ">" and angle:
            angle -= 1
            if angle == 0:
                out.append(">")
        elif angle <= 1:
            out.append(ch)
    s = re.sub(r"\s+", " ", "".join(out)).strip() or name
    return s if len(s) <= limit else s[: limit - 1] + "…"


def fmt_us(us: float | None) -> str:
    """Microseconds in a readable unit."""
    if us is None:
        return "n/a"
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3f} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.2f} us"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def _trace(con: Console, tr: TraceReport, roof: OpRoofline | None = None, flops: BlockFlops | None = None,
           memory_sort: str = "inclusive") -> None:
    rank = "" if tr.rank is None else f"rank {tr.rank}, "  # a single-process trace has none: no "rank ?"
    rank += "" if tr.cycle is None else f"cycle {tr.cycle}, "
    con.print(
        f"\n[bold]{escape(tr.path)}[/bold]  {rank}{tr.events:,} events, "
        f"host span {fmt_us(tr.host_span_us)}"
    )
    for note in tr.notes:
        con.print(f"note: {escape(note)}")
    if tr.device is None:
        con.print(f"device: {tr.device_note}")
    else:
        _device(con, tr.device)
    _blocks(con, tr, flops)
    _operators(con, tr)
    _op_flops(con, tr, roof)
    _annotations(con, tr.annotations, "annotation")
    _annotations(con, tr.modules, "module")
    _memory(con, tr, memory_sort)
    _steps(con, tr)
    _phases(con, tr)
    _critical(con, tr)


def _device(con: Console, dev: DeviceReport) -> None:
    w, t = dev.window, dev.temporal
    con.print(
        f"device window {fmt_us(w.span_us)} ({w.device_events:,} device events, rule: {w.rule}"
        + (f", {w.excluded_events:,} left out" if w.excluded_events else "")
        + ")"
    )
    tab = Table(title="Device time (each instant counted once)", title_justify="left")
    for col in ("", "time", "% of window"):
        tab.add_column(col, justify="right" if col else "left")
    for label, us, pct in (
        ("compute", t.compute_us, t.compute_pct),
        ("communication", t.communication_us, t.communication_pct),
        ("memory copy/set", t.memory_us, t.memory_pct),
        ("idle", t.idle_us, t.idle_pct),
    ):
        tab.add_row(label, fmt_us(us), _pct(pct))
    con.print(tab)
    ov = dev.overlap
    if ov.overlap_pct is not None:
        con.print(
            f"communication overlapped by compute: {_pct(ov.overlap_pct)} "
            f"of {fmt_us(ov.communication_total_us)}"
        )

    idle = dev.idle
    if idle.gaps:
        title = f"Idle gaps ({idle.gaps:,}, largest {fmt_us(idle.largest_gap_us)})"
        tab = Table(title=title, title_justify="left")
        for col in ("cause", "gaps", "time", "% of idle"):
            tab.add_column(col, justify="left" if col == "cause" else "right")
        for label, n, us in (
            ("waiting on sync", idle.sync_gaps, idle.sync_us),
            ("host-bound launch", idle.host_bound_gaps, idle.host_bound_us),
            ("other", idle.other_gaps, idle.other_us),
        ):
            share = 100.0 * us / idle.idle_us if idle.idle_us else None
            tab.add_row(label, f"{n:,}", fmt_us(us), _pct(share))
        con.print(tab)

    la = dev.launches
    if la.graph_launches:
        con.print(
            f"graph launches: {la.graph_launches:,} calls launched {la.graph_kernels:,} kernels "
            f"({fmt_us(la.graph_kernels_time_us)} of kernel time; up to {la.graph_kernels_per_launch_max:,} "
            f"kernels per call, median call {fmt_us(la.graph_launch_call_median_us)}); counted apart below"
        )
    if la.linked:
        con.print(
            f"launches: {la.linked:,}/{la.kernels:,} kernels launched one by one; launch delay median "
            f"{fmt_us(la.launch_delay_median_us)}, p90 {fmt_us(la.launch_delay_p90_us)}, max "
            f"{fmt_us(la.launch_delay_max_us)}; launch call median {fmt_us(la.launch_call_median_us)}"
        )
        con.print(
            f"kernels shorter than their launch call: {la.short_kernels:,} ({_pct(la.short_kernels_pct)}), "
            f"{fmt_us(la.short_kernels_time_us)} of kernel time"
        )

    if dev.communication is not None:
        _communication(con, dev)
    _hardware(con, dev)

    k = dev.kernels
    title = f"Top kernels ({k.count:,} device events, {fmt_us(k.total_us)} summed)"
    tab = Table(title=title, title_justify="left")
    for col in ("kernel", "type", "count", "total", "mean", "share"):
        _column(tab, col, name=col == "kernel", left=col == "type")
    for r in k.top:
        tab.add_row(_cell(short_name(r.name)), r.type, f"{r.count:,}", fmt_us(r.total_us), fmt_us(r.mean_us), _pct(r.share_pct))
    con.print(tab)


def _bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _gbps(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _communication(con: Console, dev: DeviceReport) -> None:
    cm = dev.communication
    assert cm is not None
    title = (f"Collectives ({cm.collectives:,}, sizes known for {cm.with_size:,}; from {cm.source}); "
             "bandwidth in GB/s, nccl-tests conventions")
    tab = Table(title=title, title_justify="left")
    for col in ("collective", "n", "message", "count", "total", "median", "algbw", "busbw"):
        tab.add_column(col, justify="left" if col == "collective" else "right", no_wrap=True,
                       min_width=16 if col == "collective" else None)
    for g in cm.groups[:10]:
        tab.add_row(escape(f"{g.kind} {g.dtype}".strip()), "?" if g.group_size is None else str(g.group_size),
                    _bytes(g.message_bytes), f"{g.count:,}", fmt_us(g.total_us), fmt_us(g.median_us),
                    _gbps(g.algbw_median_gbps), _gbps(g.busbw_median_gbps))  # fmt: skip
    con.print(tab)
    if cm.with_size < cm.collectives:
        con.print("note: collectives without size: the trace has no record_param_comms / kernel args with "
                  "'In msg nelems', 'dtype' and 'Group size' for them (bandwidth n/a)")


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _hardware(con: Console, dev: DeviceReport) -> None:
    hw = dev.hardware
    tab = Table(title="Hardware use (kernel args; averages weighted by kernel time)", title_justify="left")
    tab.add_column("figure", justify="left")
    tab.add_column("value", justify="right")
    tab.add_column("source", justify="left")
    res = f"{hw.with_resources:,}/{hw.kernels:,} kernels"
    if hw.with_resources:
        tab.add_row("est. achieved occupancy", _pct(hw.occupancy_pct), res)
        tab.add_row("kernel time below 25% occupancy", _pct(hw.low_occupancy_time_pct), "measured (CUPTI)")
        tab.add_row("blocks per SM", _num(hw.blocks_per_sm), "measured (CUPTI)")
        tab.add_row("kernel time with < 1 block per SM", _pct(hw.small_grid_time_pct), "measured (CUPTI)")
        tab.add_row("warps per SM", _num(hw.warps_per_sm), "measured (CUPTI)")
        tab.add_row("registers per thread", _num(hw.registers_per_thread), "measured (CUPTI)")
        tab.add_row("shared memory per block", f"{_num(hw.shared_memory_bytes, ',.0f')} B", "measured (CUPTI)")
    else:
        tab.add_row("occupancy, blocks/warps per SM", "n/a", "the trace has no kernel resource args")
    tab.add_row("compute time in tensor/matrix-core kernels", _pct(hw.tensor_core_pct),
                f"estimated from names ({hw.tensor_core_kernels:,} kernels)")
    for c in hw.copies[:6]:
        tab.add_row(escape(c.kind), f"{_gbps(c.achieved_gbps)} GB/s",
                    f"{_bytes(c.bytes)} in {fmt_us(c.time_us)} ({c.count:,})")
    con.print(tab)
    if hw.copies:
        con.print("copy bandwidth: achieved only; the link's peak is n/a (the trace does not record the link)")


def _blocks(con: Console, tr: TraceReport, flops: BlockFlops | None) -> None:
    b = tr.blocks
    if b is None:
        return
    tab = Table(title=f"Blocks (map: {escape(b.source)}; {b.ranges:,} ranges; device: summed kernel time inside; "
                      "self: not in an inner block)", title_justify="left")
    tab.add_column("block", justify="left", overflow="ellipsis", min_width=16)
    # with FLOPs the kernel counts and shares make way (both in --json)
    for col in ["calls", "device", "self", "FLOPs", "FLOP/s"] if flops else ["calls", "kernels", "device", "self", "share"]:
        _column(tab, col)
    for i, r in enumerate(b.rows[:_MAX_ROWS]):
        cells: list[str | Text] = [_cell("  " * r.depth + r.block), f"{r.calls:,}"]
        cells += [fmt_us(r.device_us), fmt_us(r.self_device_us)] if flops else [f"{r.kernels:,}", fmt_us(r.device_us),
                                                                                 fmt_us(r.self_device_us)]
        if flops is not None:
            f = flops.rows[i]
            cells += ["n/a" if f.flops is None else si(f.flops, "FLOP"),
                      "n/a" if f.achieved_flops_per_s is None else si(f.achieved_flops_per_s, "FLOP/s")]
        else:
            cells.append(_pct(r.device_pct))
        tab.add_row(*cells)
    con.print(tab)
    if len(b.rows) > _MAX_ROWS:
        con.print(f"{len(b.rows) - _MAX_ROWS} more block rows with --json")
    con.print(f"outside every block: {b.unattributed_events:,} device events, {fmt_us(b.unattributed_us)}")
    if flops is not None:
        con.print(f"FLOPs: estimated for {escape(flops.model)} at batch {flops.batch}, sequence {flops.seq_len} "
                  "(lmprof's formulas); FLOP/s: FLOPs over the block's summed kernel time")


def _operators(con: Console, tr: TraceReport) -> None:
    ops = tr.operators
    if not ops.count:
        con.print("no CPU operators in trace")
        return
    tab = Table(title=f"Top CPU operators by self time ({ops.count:,} calls)", title_justify="left")
    for col in ("operator", "count", "self", "total", "share"):
        _column(tab, col, name=col == "operator")
    for r in ops.top:
        tab.add_row(_cell(short_name(r.name)), f"{r.count:,}", fmt_us(r.self_us), fmt_us(r.total_us), _pct(r.share_pct))
    con.print(tab)


def _op_flops(con: Console, tr: TraceReport, roof: OpRoofline | None) -> None:
    of = tr.op_flops
    if of is None:
        return
    if not of.rows:
        con.print(f"{of.ops_with_shapes:,} operator calls with shapes, none of a counted kind (mm, linear, sdpa, ...)")
        return
    time = "device time of its kernels" if of.time_source == "device" else "CPU time"
    head = (f"FLOPs from recorded shapes ({of.counted:,} of {of.ops_with_shapes:,} calls counted; "
            f"{si(of.total_flops, 'FLOP')}, {si(of.total_bytes, 'B')} in outermost ops; time: {time})")  # fmt: skip
    if roof is not None:
        head += f"; roofline: {roof.device}"
    tab = Table(title=head, title_justify="left")
    cols = ["operator, input shapes, dtype", "count", "time", "FLOP/s", "B/s"]
    cols += ["bound", "roof"] if roof is not None else []
    for col in cols:
        _column(tab, col, name=col.startswith("operator"))
    for i, r in enumerate(of.rows):
        label = f"{'  ' if r.nested else ''}{short_name(r.name)} {r.shapes} {r.dtype or '?'}"
        cells: list[str | Text] = [
            _cell(label), f"{r.count:,}", fmt_us(r.time_us),
            "n/a" if r.achieved_flops_per_s is None else si(r.achieved_flops_per_s),
            "n/a" if r.achieved_bytes_per_s is None else si(r.achieved_bytes_per_s),
        ]  # fmt: skip
        if roof is not None:
            p = roof.rows[i]
            cells += [p.bound.removesuffix("-bound").replace("unknown", "n/a"), _pct(p.roof_pct)]
        tab.add_row(*cells)
    con.print(tab)
    if any(r.nested for r in of.rows):
        con.print("indented: inside another counted operator (its FLOPs are not counted twice in the totals)")


def _column(tab: Table, title: str, *, name: bool = False, left: bool = False) -> None:
    """A name column shrinks to the terminal and cuts names with an ellipsis; numbers never wrap."""
    if name:  # the only column rich may narrow; its cells (_cell) stay on one line
        tab.add_column(title, justify="left", overflow="ellipsis")
    else:
        tab.add_column(title, justify="left" if left else "right", no_wrap=True)


def _annotations(con: Console, an: Annotations | None, what: str) -> None:
    if an is None:
        return
    device = any(r.device_us is not None for r in an.rows)
    own = "outside child modules" if what == "module" else "outside operators and annotations inside"
    tab = Table(title=f"{what.capitalize()}s ({an.count:,} ranges; self: {own}; dead: start to its first operator)",
                title_justify="left")  # fmt: skip
    cols = [what, "count", "total", "self"] + (["device"] if device else []) + ["dead mean", "dead max"]
    for col in cols:
        _column(tab, col, name=col == what)
    for r in an.rows[:_MAX_ROWS]:
        cells: list[str | Text] = [_cell("  " * r.depth + short_name(r.name)), f"{r.count:,}", fmt_us(r.total_us), fmt_us(r.self_us)]
        if device:
            cells.append(fmt_us(r.device_us))
        cells += [fmt_us(r.dead_mean_us), fmt_us(r.dead_max_us)]
        tab.add_row(*cells)
    con.print(tab)
    if len(an.rows) > _MAX_ROWS:
        con.print(f"{len(an.rows) - _MAX_ROWS} more {what} rows with --json")
    _step_dead(con, an)


def _step_dead(con: Console, an: Annotations) -> None:
    """Each ProfilerStep's dead window: which step stalled, where the row above gives a mean and a max."""
    if not an.steps:
        return
    kernels = any(s.to_first_kernel_us is not None for s in an.steps)
    tab = Table(title="Dead window per ProfilerStep (from its start" + (
        "; to the first kernel: the first device event its calls launched, late when the device runs behind)"
        if kernels else ")"), title_justify="left")
    for col in ["step", "to first operator", "first operator"] + (["to first kernel"] if kernels else []):
        _column(tab, col, name=col == "first operator")
    for s in an.steps[:_MAX_ROWS]:
        cells: list[str | Text] = [f"#{s.step}", fmt_us(s.dead_us), _cell(short_name(s.first_op or "n/a"))]
        if kernels:
            cells.append(fmt_us(s.to_first_kernel_us))
        tab.add_row(*cells)
    con.print(tab)
    if len(an.steps) > _MAX_ROWS:
        con.print(f"{len(an.steps) - _MAX_ROWS} more steps with --json")


def _memory(con: Console, tr: TraceReport, sort: str) -> None:
    mem = tr.memory
    if mem is None:
        return
    rows, other = (mem.top_self, "inclusive") if sort == "self" else (mem.top, "self")
    for d in mem.devices:
        reserved = "" if d.peak_reserved_bytes is None else f", reserved peak {_bytes(d.peak_reserved_bytes)}"
        con.print(
            f"memory {d.device}: peak allocated {_bytes(d.peak_allocated_bytes)} at {fmt_us(d.peak_at_us)}{reserved}; "
            f"{_bytes(d.allocated_bytes)} allocated, {_bytes(d.freed_bytes)} freed in {d.events:,} events"
        )
    device = any(r.device_bytes or r.self_device_bytes for r in rows)
    tab = Table(title=f"Memory by operator / annotation, by {sort} bytes (net: allocated minus freed)",
                title_justify="left")  # fmt: skip
    cols = ["name", "count", "self cpu", "cpu incl.", "allocated", "freed"] + (["self device", "device incl."] if device else [])
    for col in cols:
        _column(tab, col, name=col == "name")
    for r in rows:
        cells: list[str | Text] = [_cell(short_name(r.name)), f"{r.count:,}", _sbytes(r.self_cpu_bytes), _sbytes(r.cpu_bytes),
                 _bytes(r.cpu_allocated_bytes), _bytes(r.cpu_freed_bytes)]  # fmt: skip
        if device:
            cells += [_sbytes(r.self_device_bytes), _sbytes(r.device_bytes)]
        tab.add_row(*cells)
    con.print(tab)
    con.print(f"incl.: the operator's and everything it called; self: its own. By {other} bytes: --sort {other}")


def _cell(name: str) -> Text:
    """A name cut with an ellipsis where the column is narrower, never wrapped to a second line."""
    return Text(name, no_wrap=True, overflow="ellipsis")


def _tail(path: str) -> str:
    parts = path.split(" > ")
    return path if len(parts) <= 2 else "… > " + " > ".join(parts[-2:])


def _sbytes(n: int) -> str:
    return "-" + _bytes(-n) if n < 0 else _bytes(n)


def _steps(con: Console, tr: TraceReport) -> None:
    st = tr.steps
    if st is None:
        con.print("no ProfilerStep annotations in trace")
        return
    con.print(
        f"steps: {st.count} ProfilerStep, median {st.median_ms:.3f} ms (p10 {st.p10_ms:.3f}, "
        f"p90 {st.p90_ms:.3f}, min {st.min_ms:.3f}, max {st.max_ms:.3f})"
    )


def _phases(con: Console, tr: TraceReport) -> None:
    ph = tr.phases
    if ph is None:
        return
    steps = f"{len(ph.steps)} step(s) from {ph.source}" if ph.source != "whole trace" else "the whole trace"
    tab = Table(title=f"Phases per step (host time; {steps})", title_justify="left")
    for col in ("phase", "total", "% of steps", "median per step"):
        _column(tab, col, left=col == "phase")
    for p, us in ph.total_us.items():
        if us > 0:
            med = sorted(s.phases_us[p] for s in ph.steps)[len(ph.steps) // 2]
            tab.add_row(p, fmt_us(us), _pct(ph.total_pct[p]), fmt_us(med))
    con.print(tab)


_SEGMENT_LABELS = {
    "cpu": "host CPU work", "launch_call": "host in launch calls", "data_loader": "host in data loader",
    "launch_latency": "launch latency (call end to kernel start)", "computation": "compute kernels",
    "communication": "communication kernels", "memory": "memcpy / memset", "sync": "sync return",
    "device_wait": "device gap on the stream", "cross_stream": "waiting on another stream",
    "unknown": "unexplained",
}  # fmt: skip


def _critical(con: Console, tr: TraceReport) -> None:
    cp = tr.critical_path
    if cp is None:
        return
    incl = " incl. device work" if tr.device is not None else ""
    tab = Table(title=f"Critical path of {len(cp.steps)} step(s) (median {cp.step_ms:.3f} ms{incl})",
                title_justify="left")  # fmt: skip
    tab.add_column("on the path", justify="left")
    tab.add_column("% of steps", justify="right")
    for key, pct in sorted(cp.segments_pct.items(), key=lambda kv: -kv[1]):
        if pct >= 0.05:
            tab.add_row(_SEGMENT_LABELS.get(key, key), _pct(pct))
    con.print(tab)
    # a CPU-only trace's path is all host work: a what-if that saves nothing there is a zero, left out
    ifs = [w for w in cp.what_if if tr.device is not None or w.saving_pct > 0]
    if not ifs:
        return
    tab = Table(title="What if (optimistic: another path may become critical)", title_justify="left")
    for col in ("change", "median step", "saving"):
        tab.add_column(col, justify="left" if col == "change" else "right", overflow="fold")
    for w in ifs:
        change = w.change
        if change.startswith("top kernel") and cp.top_kernel:
            change += f" ({short_name(cp.top_kernel, 60)})"
        tab.add_row(escape(change), f"{w.step_ms:.3f} ms", _pct(w.saving_pct))
    con.print(tab)
    if not cp.linked and tr.device is not None:
        con.print("note: no device work linked to launch calls: the path stays on the host")


def _ranks(con: Console, report: Report | CycleRanks, prefix: str = "") -> None:
    rc = report.ranks
    assert rc is not None
    tab = Table(
        title=f"{prefix}Ranks ({len(rc.ranks)}): median step, device window, compute, all communication, idle",
        title_justify="left",
    )
    for col in ("rank", "step", "window", "compute", "comm", "idle", "idle%"):
        tab.add_column(col, justify="right", no_wrap=True)
    for r in _some_ranks(rc):
        tab.add_row(
            str(r.rank),
            "n/a" if r.step_ms is None else f"{r.step_ms:.3f} ms",
            fmt_us(r.span_us),
            fmt_us(r.compute_us),
            fmt_us(r.communication_total_us),
            fmt_us(r.idle_us),
            _pct(r.idle_pct),
        )
    con.print(tab)
    if len(rc.ranks) > _RANK_ROWS:
        con.print(f"the {_RANK_ROWS // 2} slowest and fastest of {len(rc.ranks):,} ranks by {rc.measure}; "
                  "every rank with --json")
    by = {"step_ms": "median step time", "span_us": "device window", "host_span_us": "host span"}[rc.measure]
    con.print(
        f"slowest rank {rc.slowest_rank}: {_pct(rc.slowest_over_fastest_pct)} slower than the fastest "
        f"(rank {rc.fastest_rank}), {_pct(rc.slowest_over_median_pct)} over the median, by {by}"
    )
    cm = report.collectives
    if cm is not None:
        tab = Table(
            title=f"Collectives matched across ranks by {cm.match_by}: {cm.matched:,} "
            f"({cm.unmatched:,} on some ranks only, left out)",
            title_justify="left",
        )
        for col in ("rank", "time", "waiting", "transferring", "waiting %"):
            tab.add_column(col, justify="right", no_wrap=True)
        shown = cm.ranks
        if len(shown) > _RANK_ROWS:  # the ranks that waited most
            most = {c.rank for c in sorted(shown, key=lambda c: (-c.wait_us, c.rank))[:_RANK_ROWS]}
            shown = [c for c in shown if c.rank in most]
        for c in shown:
            tab.add_row(str(c.rank), fmt_us(c.time_us), fmt_us(c.wait_us), fmt_us(c.transfer_us), _pct(c.wait_pct))
        con.print(tab)
        if len(shown) < len(cm.ranks):
            con.print(f"the {len(shown)} of {len(cm.ranks):,} ranks that waited longest; every rank with --json")
    if rc.communication_skew_us is not None:
        con.print(
            f"communication time skew: {fmt_us(rc.communication_skew_us)} between ranks "
            f"({_pct(rc.communication_skew_pct)} of the mean)"
        )
    _cross_rank(con, report)


def _some_ranks(rc: RankComparison) -> list[RankRow]:
    """Every rank, or with many the slowest and the fastest by the comparison's measure, in rank order."""
    if len(rc.ranks) <= _RANK_ROWS:
        return rc.ranks
    value = {r.rank: getattr(r, rc.measure) or 0.0 for r in rc.ranks}
    by = sorted(rc.ranks, key=lambda r: (value[r.rank], r.rank))
    keep = {r.rank for r in by[: _RANK_ROWS // 2] + by[-(_RANK_ROWS // 2):]}
    return [r for r in rc.ranks if r.rank in keep]


def _cross_rank(con: Console, report: Report | CycleRanks) -> None:
    x = report.cross_rank
    if x is None:
        return
    tab = Table(
        title=f"Critical path across ranks ({x.collectives_linked:,} collective(s) on a path linked by "
        f"{x.matched_by})",
        title_justify="left",
    )
    for col in ("step", "rank", "path", "waiting for other ranks", "waited for"):
        tab.add_column(col, justify="left" if col == "waited for" else "right", no_wrap=True)
    for r in x.rows[:_MAX_ROWS]:
        waited = ", ".join(f"rank {q}: {fmt_us(us)}" for q, us in sorted(r.waited_for.items(), key=lambda kv: -kv[1]))
        share = 100.0 * r.rank_wait_us / r.path_us if r.path_us > 0 else None
        tab.add_row(str(r.step), str(r.rank), fmt_us(r.path_us), f"{fmt_us(r.rank_wait_us)} ({_pct(share)})",
                    waited or "-")  # fmt: skip
    con.print(tab)
    if len(x.rows) > _MAX_ROWS:
        con.print(f"{len(x.rows) - _MAX_ROWS:,} more rows with --json")
    for s in x.steps:
        if s.critical_rank is not None:
            con.print(f"step {s.step}: the job's path runs through rank {s.critical_rank} (the others waited for it)")
    con.print(
        f"what if no rank waited for another (optimistic): median step {x.balanced_step_ms:.3f} ms "
        f"instead of {x.step_ms:.3f} ms"
    )
    con.print(f"note: {escape(x.note)}")


def render_diff(d: DiffReport, console: Console | None = None) -> None:
    """Print a comparison of two traces: one table per kind, largest time delta first."""
    con = console or Console(highlight=False)
    con.print(f"before: [bold]{escape(d.before)}[/bold]\nafter:  [bold]{escape(d.after)}[/bold]")
    if d.step_before_ms is not None and d.step_after_ms is not None:
        change = 100.0 * (d.step_after_ms - d.step_before_ms) / d.step_before_ms if d.step_before_ms else None
        con.print(f"median step: {d.step_before_ms:.3f} ms -> {d.step_after_ms:.3f} ms ({_pct(change)})")
    if d.noise_pct is not None:
        con.print(f"noise: the before trace's steps spread {_pct(d.noise_pct)} (p10 to p90 over the median)")
    what = {"annotation": "inclusive time", "operator": "self time", "kernel": "device time"}
    for kind in KINDS:
        s = d.summary[kind]
        rows = [r for r in d.rows if r.kind == kind]
        head = (f"{kind}s: {s['changed']} changed, {s['new']} new, {s['vanished']} vanished, "
                f"{s['unchanged']} unchanged")  # fmt: skip
        if not rows:
            if s["unchanged"]:
                con.print(f"{head}: no change")
            continue
        tab = Table(title=f"{head} (by {what[kind]})", title_justify="left")
        for col in (kind, "", "count", "before", "after", "delta", "%"):
            _column(tab, col, name=col == kind, left=col == "")
        for r in rows:
            count = f"{r.count_before:,}" if r.count_before == r.count_after else f"{r.count_before:,}->{r.count_after:,}"
            sign = "+" if r.delta_us > 0 else ""
            # an annotation path keeps its innermost names, which tell rows apart, when cut
            name = short_name(r.name) if kind != "annotation" else _tail(r.name)
            tab.add_row(_cell(name), r.status if r.status != "changed" else "", count,
                        fmt_us(r.before_us), fmt_us(r.after_us), sign + fmt_us(r.delta_us),
                        "" if r.delta_pct is None else f"{sign}{r.delta_pct:.1f}%")  # fmt: skip
        con.print(tab)


def render_snapshot(rep: SnapshotReport, console: Console | None = None) -> None:
    """Print a CUDA memory snapshot's summary: per device, OOMs, categories, top blocks and lines."""
    con = console or Console(highlight=False)
    con.print(f"\n[bold]{escape(rep.path)}[/bold]  CUDA memory snapshot")
    for note in rep.notes:
        con.print(f"note: {escape(note)}")
    for d in rep.devices:
        when = "at the snapshot" if d.peak_at_us is None else f"at time_us {d.peak_at_us:,.0f}"
        con.print(
            f"cuda:{d.device}: {_bytes(d.allocated_bytes)} allocated, {_bytes(d.reserved_bytes)} reserved in "
            f"{d.segments:,} segments; peak allocated {_bytes(d.peak_allocated_bytes)} {when} "
            f"(over {d.trace_entries:,} recorded actions)"
        )
    for o in rep.ooms:
        free = "n/a" if o.device_free_bytes is None else _bytes(o.device_free_bytes)
        con.print(
            f"OOM on cuda:{o.device}: asked {_bytes(o.requested_bytes)} with {free} free on the device and "
            f"{_bytes(o.allocated_bytes)} allocated; from {escape(o.frame or '(no stack)')}"
        )
    if rep.categories_bytes:
        con.print("live bytes by category: " + ", ".join(f"{k} {_bytes(v)}" for k, v in rep.categories_bytes.items()))
    if rep.top:
        tab = Table(title="Largest live blocks", title_justify="left")
        for col in ("allocated at", "device", "bytes", "category"):
            _column(tab, col, name=col == "allocated at")
        for a in rep.top:
            tab.add_row(_cell(a.frame or "(no stack)"), f"cuda:{a.device}", _bytes(a.bytes), a.category)
        con.print(tab)
    if rep.frames:
        tab = Table(title="Live bytes per allocating line (innermost frame outside torch)", title_justify="left")
        for col in ("line", "blocks", "bytes"):
            _column(tab, col, name=col == "line")
        for r in rep.frames:
            tab.add_row(_cell(r.frame), f"{r.blocks:,}", _bytes(r.bytes))
        con.print(tab)
