"""The run report's "Whole run" section: step time and memory over the watched steps, alerts, captures.

The series is read chunk by chunk (only files inside the run folder, each checked by
:func:`~lmprof.show.html.file_inside`; at most :data:`MAX_FILES` of them) and each chunk is reduced to
a bounded number of buckets (min, mean and max per bucket), so the chart has at most about
:data:`MAX_POINTS` points whatever the run's length, and reading a long series holds one chunk at a
time. Alerts are shaded over their steps, captured windows marked by a line where they began.
Everything from the record reaches the page through the autoescaping templates; the chart draws
only numbers and the fixed alert kinds.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmprof.errors import DataError
from lmprof.record.run import Run, WatchSection
from lmprof.record.watch import read_chunk
from lmprof.show.format import human_bytes, number
from lmprof.show.html import Absent, Bullets, Cell, CellLike, Heading, Para, figure, file_inside, local_href, table
from lmprof.show.literal import literal_text

MAX_POINTS = 2000
MAX_FILES = 10_000
MAX_ROWS = 200  # alerts and captures listed; a record may hold any number
KIND_COLORS = {"drift": "#c44e52", "spike": "#dd8452", "memory_creep": "#8172b3", "input_bound": "#55a868",
               "straggler": "#937860"}


@dataclass
class Envelope:
    """A downsampled series: per bucket its first step, the min, mean and max of the finite values."""

    step: list[np.ndarray] = field(default_factory=list)
    lo: list[np.ndarray] = field(default_factory=list)
    mean: list[np.ndarray] = field(default_factory=list)
    hi: list[np.ndarray] = field(default_factory=list)

    def add(self, steps: np.ndarray, values: np.ndarray, buckets: int) -> None:
        """Reduce one chunk (in step order) to at most ``buckets`` points."""
        n = len(steps)
        if not n:
            return
        edges = np.unique(np.linspace(0, n, min(buckets, n) + 1).astype(np.int64))[:-1]
        ok = np.isfinite(values)
        count = np.add.reduceat(ok.astype(np.int64), edges)
        total = np.add.reduceat(np.where(ok, values, 0.0), edges)
        lo = np.minimum.reduceat(np.where(ok, values, np.inf), edges)
        hi = np.maximum.reduceat(np.where(ok, values, -np.inf), edges)
        has = count > 0
        self.step.append(steps[edges][has])
        self.lo.append(lo[has])
        self.hi.append(hi[has])
        self.mean.append(total[has] / count[has])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.step:
            e = np.empty(0)
            return e, e, e, e
        return (np.concatenate(self.step), np.concatenate(self.lo), np.concatenate(self.mean),
                np.concatenate(self.hi))


@dataclass
class Series:
    """What the chart draws, and why parts of it are missing."""

    step_ms: Envelope = field(default_factory=Envelope)
    memory: Envelope = field(default_factory=Envelope)
    memory_label: str = ""
    problems: list[str] = field(default_factory=list)


def read_envelopes(run: Run, watch: WatchSection) -> Series:
    """The run's watched series, downsampled (files outside the run folder or unreadable are named)."""
    out = Series()
    names = watch.series[:MAX_FILES]
    if len(watch.series) > MAX_FILES:
        out.problems.append(f"{len(watch.series) - MAX_FILES:,} series files beyond the first {MAX_FILES:,} not read")
    per_file = max(MAX_POINTS // max(len(names), 1), 1)
    for name in names:
        path = file_inside(run.folder, name)
        if path is None or not path.is_file():
            out.problems.append(f"{name}: {'missing' if path is not None else 'not a file inside the run folder'}, "
                                "not shown")
            continue
        try:
            rows = read_chunk(path, ["step", "step_s", "mem_allocated_B", "rss_B"])
        except DataError as exc:
            out.problems.append(f"{exc}: not shown")
            continue
        out.step_ms.add(rows["step"], rows["step_s"] * 1e3, per_file)
        mem_col = "mem_allocated_B" if np.isfinite(rows["mem_allocated_B"]).any() else "rss_B"
        out.memory_label = out.memory_label or ("allocated (CUDA)" if mem_col == "mem_allocated_B" else "RSS")
        out.memory.add(rows["step"], rows[mem_col], per_file)
    return out


@literal_text
def watch_chart_png(watch: WatchSection, series: Series) -> bytes | None:
    """Step time (top) and memory (bottom) over the watched steps; alerts shaded, captures marked."""
    s, lo, mean, hi = series.step_ms.arrays()
    if not len(s):
        return None
    from matplotlib.figure import Figure  # lazy: matplotlib only when a chart is drawn

    ms, mlo, mmean, mhi = series.memory.arrays()
    fig = Figure(figsize=(9.5, 5.2), dpi=110)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ax1.fill_between(s, lo, hi, color="#4c72b0", alpha=0.25, linewidth=0, step="post", label="min-max per bucket")
    ax1.plot(s, mean, color="#4c72b0", linewidth=1.0, drawstyle="steps-post", label="mean per bucket")
    if watch.baseline is not None:
        ax1.axhline(watch.baseline.step_s_median * 1e3, color="#333333", linestyle="--", linewidth=0.8,
                    label="clean median")
    ax1.set_ylabel("step time (ms)")
    if len(ms):
        gib = 1024.0 ** 3
        ax2.fill_between(ms, mlo / gib, mhi / gib, color="#8172b3", alpha=0.25, linewidth=0, step="post")
        ax2.plot(ms, mmean / gib, color="#8172b3", linewidth=1.0, drawstyle="steps-post")
        ax2.set_ylabel(f"memory, {series.memory_label} (GiB)")
    else:
        ax2.text(0.5, 0.5, "memory not recorded", transform=ax2.transAxes, ha="center", va="center",
                 color="#777777")
        ax2.set_yticks([])
    ax2.set_xlabel("step")
    seen: set[str] = set()
    for a in watch.alerts:
        color = KIND_COLORS.get(a.kind, "#777777")
        for ax in (ax1, ax2):
            ax.axvspan(a.first_step, a.last_step + 1, color=color, alpha=0.15, linewidth=0,
                       label=a.kind.replace("_", " ") if ax is ax1 and a.kind not in seen else None)
        seen.add(a.kind)
    for i, c in enumerate(watch.captures):
        for ax in (ax1, ax2):
            ax.axvline(c.first_step, color="#222222", linewidth=1.0, linestyle=":",
                       label="capture" if ax is ax1 and i == 0 else None)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        for spine in ("top", "right"):
            ax.spines[spine].set_visible(False)
    ax1.legend(loc="upper left", fontsize=7, frameon=False, ncol=3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def evidence_text(evidence: dict[str, Any]) -> str:
    """'rate 1.05 MB/step; growth 130 MB' from an alert's figures."""
    parts = []
    for k, m in evidence.items():
        if m.value is None:
            continue
        if m.unit in ("B", "B/step"):
            value = human_bytes(m.value) + m.unit[1:]
        else:
            value = number(m.value, m.unit)
        parts.append(f"{k.replace('_', ' ')} {value}")
    return "; ".join(parts)


def growth_line(g: Any) -> str:
    """'mlp.fc (forward, block): 2.00 -> 6.00 ms per profiled step (+4.00 ms, 3.00x)'."""
    ratio = "new" if g.ratio is None else f"{g.ratio:.2f}x"
    noise = "" if g.beyond_noise else f"; within noise ({g.noise_ms:.3g} ms)"
    return (f"{g.name} ({g.phase}, {g.kind}): {g.before_ms:.3g} -> {g.after_ms:.3g} ms per profiled step "
            f"(+{g.delta_ms:.3g} ms, {ratio}{noise})")


def watch_parts(run: Run, report_dir: Path) -> list[Any]:
    """The section's parts: what was watched, the chart, the alerts, the captures, the notes."""
    w = run.watch
    if w is None:
        return [Absent("this run was not watched (lmprof run --watch)")]
    base = w.baseline
    intro = f"{w.steps:,} step(s) watched after the measured window"
    if w.first_step is not None and w.last_step is not None:
        intro += f" (steps {w.first_step}-{w.last_step})"
    if base is not None:
        intro += f", judged against the clean median {number(base.step_s_median * 1e3, 'ms')} (n={base.n})"
    parts: list[Any] = [Para(intro + ".", intro=True)]
    series = read_envelopes(run, w)
    png = watch_chart_png(w, series)
    parts.append(figure(png, "Step time and memory over the run (downsampled)") if png
                 else Absent("no series to draw"))
    if series.problems:
        parts.append(Bullets(series.problems[:20]))
    parts.append(Heading("Alerts"))
    if w.alerts:
        alert_rows: list[list[CellLike]] = [
            [Cell(a.kind.replace("_", " "), "code"), f"{a.first_step}-{a.last_step}" + (" (ongoing)" * a.ongoing),
             a.message, Cell(evidence_text(a.evidence), "note")] for a in w.alerts[:MAX_ROWS]]
        parts.append(table(["kind", "steps", "what", "evidence"], alert_rows, cls="alerts"))
        if len(w.alerts) > MAX_ROWS:
            parts.append(Para(f"{len(w.alerts) - MAX_ROWS:,} more alerts in run.json.", intro=True))
    else:
        parts.append(Absent("no alert: every watched step stayed within the clean steps' noise"))
    if w.alerts_dropped:
        parts.append(Para("Not kept (over the cap per kind): " + ", ".join(
            f"{n} {k}" for k, n in sorted(w.alerts_dropped.items())), intro=True))
    parts.append(Heading("Captured windows"))
    if w.captures:
        rows: list[list[CellLike]] = []
        for c in w.captures[:MAX_ROWS]:
            report = file_inside(run.folder, f"{c.path}/report.html")  # only a report inside the run folder
            where = (Cell(c.path, "link", href=local_href(report, report_dir)) if report is not None
                     and report.is_file() else Cell(c.path, "code"))
            asked = c.requested_by if c.alert is None else f"alert {c.alert + 1}"
            rows.append([where, f"{c.first_step}", f"{c.steps}", asked,
                         Cell("; ".join(growth_line(g) for g in c.grew[:5]) or (c.note or "—"), "note")])
        parts.append(table(["run folder", "first step", "steps", "asked by", "what grew"], rows, num=(1, 2)))
    else:
        parts.append(Absent("no window was captured"))
    if w.notes:
        parts += [Heading("Notes"), Bullets(list(w.notes))]
    return parts
