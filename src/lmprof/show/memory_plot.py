"""PNG of memory over one training step: stacked categories, phase boundaries, the peak marked.

Forward rises (activations pile up), backward falls (they are freed as gradients appear), the
optimizer step spikes with its temporaries. The top panel is over time (ms, under the profiler);
the bottom one is over allocation events in order, so short phases such as the optimizer step,
a sliver in time, are wide enough to see. Reads :class:`lmprof.measure.memory_timeline.MemoryTimeline`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from lmprof.atomic import atomic_path
from lmprof.show.literal import literal_text

if TYPE_CHECKING:
    from lmprof.measure.memory_timeline import MemoryTimeline

MIB = 1024 * 1024

# One colour per category, stacked bottom (long-lived) to top (short-lived).
COLORS = {
    "params": "#4c72b0",
    "optimizer": "#8172b3",
    "grads": "#dd8452",
    "kv_cache": "#64b5cd",
    "activations": "#55a868",
    "outputs": "#ccb974",
    "temporaries": "#c44e52",
    "other": "#a0a0a0",
}
# What a category's legend entry says where its name alone would mislead.
LABELS = {"kv_cache": "KV cache (+ carried logits)"}
PHASE_SHADE = {"forward": "#e8f3e8", "backward": "#fbeee6", "optimizer": "#eeeaf6", "zero_grad": "#f4f4f4",
               "data": "#f4f4f4", "prefill": "#e8f3e8", "decode": "#fbeee6"}


def _thin(n: int, totals: Sequence[int], max_points: int) -> list[int]:
    """Indices to draw: all, or per bucket of events the lowest and highest total (peaks survive)."""
    if n <= max_points:
        return list(range(n))
    buckets = max_points // 2
    keep: set[int] = {0, n - 1}
    for b in range(buckets):
        seg = range(b * n // buckets, max((b + 1) * n // buckets, b * n // buckets + 1))
        keep.add(min(seg, key=totals.__getitem__))
        keep.add(max(seg, key=totals.__getitem__))
    return sorted(k for k in keep if k < n)


def _steps(xs: Sequence[float], idx: list[int], tl: "MemoryTimeline", x_end: float) -> tuple[list[float], dict[str, list[float]]]:
    """Step-shaped series: each level holds until the next event."""
    sx: list[float] = []
    sy: dict[str, list[float]] = {c: [] for c in tl.categories}
    prev = None
    for k in idx:
        if prev is not None:
            sx.append(xs[k])
            for c in sy:
                sy[c].append(tl.categories[c][prev] / MIB)
        sx.append(xs[k])
        for c in sy:
            sy[c].append(tl.categories[c][k] / MIB)
        prev = k
    if prev is not None:
        sx.append(x_end)
        for c in sy:
            sy[c].append(tl.categories[c][prev] / MIB)
    return sx, sy


def runs_of(spans: Sequence[tuple[str, float, float]]) -> list[tuple[str, float, float, int]]:
    """Consecutive spans of one phase merged: (name, start, end, how many). A generation's 49 decode
    steps are one run, labelled once ("decode x49"), not 49 labels on top of each other."""
    out: list[tuple[str, float, float, int]] = []
    for name, a, b in spans:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1], max(out[-1][2], b), out[-1][3] + 1)
        else:
            out.append((name, a, b, 1))
    return out


def _draw(ax: Any, tl: "MemoryTimeline", xs: Sequence[float], spans: list[tuple[str, float, float]],
          x_end: float, peak_x: float, ymax: float, max_points: int, legend: bool) -> None:
    idx = _thin(len(xs), tl.allocated, max_points)
    sx, sy = _steps(xs, idx, tl, x_end)
    x_start = min([0.0] + [a for _, a, _ in spans])
    width = (x_end - x_start) or 1.0
    for name, a, b in spans:
        ax.axvspan(a, b, color=PHASE_SHADE.get(name, "#f4f4f4"), zorder=0, lw=0)
    for name, a, b, n in runs_of(spans):
        ax.axvline(a, color="#555555", ls="--", lw=0.8, zorder=3)  # where a phase begins
        frac = (b - a) / width
        if frac >= 0.015:  # narrower phases are labelled in the other panel
            narrow = frac < 0.08
            ax.text((a + b) / 2, ymax * 0.985, name if n == 1 else f"{name} \u00d7{n}", ha="center", va="top",
                    fontsize=8 if narrow else 9, rotation=90 if narrow else 0, color="#333333", zorder=4)
    for (name, a, _), (prev, _, _) in zip(spans[1:], spans[:-1]):
        if name == prev:  # a step boundary inside a run of one phase: a faint tick, not a label
            ax.axvline(a, color="#555555", ls=":", lw=0.4, alpha=0.5, zorder=3)
    shown = [c for c in tl.categories if any(v > 0 for v in sy[c])]
    if sx and shown:
        k = tl.allocated.index(tl.peak) if tl.peak in tl.allocated else None
        labels = [f"{LABELS.get(c, c)} ({_mib(tl.categories[c][k] if k is not None else 0)} MiB at peak)"
                  for c in shown]
        ax.stackplot(sx, [sy[c] for c in shown], labels=labels, colors=[COLORS.get(c, "#999999") for c in shown],
                     alpha=0.9, zorder=2, lw=0)
    ax.plot([peak_x], [tl.peak / MIB], marker="v", color="black", zorder=5)
    ax.set_xlim(x_start, x_end if x_end > x_start else x_start + 1.0)
    ax.set_ylim(0, ymax)
    ax.set_ylabel("allocated (MiB)")
    ax.grid(axis="y", color="#dddddd", lw=0.6, zorder=1)
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _mib(n: float) -> str:
    """Bytes in MiB as the axis reads them: one decimal from 1 MiB up, two significant figures below (a
    small model's 17 KiB peak read "0.0 MiB")."""
    v = n / MIB
    return f"{v:,.1f}" if abs(v) >= 1 or v == 0 else f"{v:.2g}"


@literal_text
def plot_memory_timeline(
    timeline: "MemoryTimeline",
    path: str | Path,
    title: str | None = None,
    estimated_peak: int | None = None,
    max_points: int = 6000,
) -> Path:
    """Draw the timeline as stacked areas (MiB) into a PNG at ``path``; return the path.

    ``title`` should name model / batch / seq / dtype / device (see :func:`timeline_title`).
    ``estimated_peak`` (bytes) draws the analytic peak as a dotted line for comparison.
    """
    # The Agg canvas itself, not pyplot: lmprof.profile() and the callbacks draw this inside the user's
    # process, where matplotlib.use("Agg") switched the user's own backend (an svg or inline one read
    # Agg after the with-block) and pyplot kept a global figure.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tl = timeline
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 8), dpi=110)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2]})
    ymax = max([tl.peak / MIB] + ([estimated_peak / MIB] if estimated_peak else [])) * 1.12 or 1.0
    n = len(tl.t_ms)
    peak_k = tl.allocated.index(tl.peak) if tl.peak in tl.allocated else 0

    # Top: over time.
    t_end = max([tl.t_ms[-1] if n else 0.0] + [p.end_ms for p in tl.phases])
    spans = [(p.name, p.start_ms, p.end_ms) for p in tl.phases]
    _draw(top, tl, tl.t_ms, spans, t_end, tl.peak_ms, ymax, max_points, legend=True)
    right_half = tl.peak_ms > (t_end / 2 if t_end else 0.0)  # keep the label inside the axes
    top.annotate(f"peak {_mib(tl.peak)} MiB" + (f" ({tl.peak_phase})" if tl.peak_phase else ""),
                 (tl.peak_ms, tl.peak / MIB), textcoords="offset points", xytext=(-6 if right_half else 6, 6),
                 ha="right" if right_half else "left", fontsize=9, zorder=5)
    top.set_xlabel("time in step (ms, under the profiler)")
    # Bottom: over allocation events, phases placed at their first event.
    ev = list(range(n))
    ev_spans = []
    for p in tl.phases:
        a = next((i for i, t in enumerate(tl.t_ms) if t >= p.start_ms), n)
        b = next((i for i, t in enumerate(tl.t_ms) if t > p.end_ms), n)
        ev_spans.append((p.name, float(a), float(b)))
    _draw(bottom, tl, ev, ev_spans, float(n), float(peak_k), ymax, max_points, legend=False)
    bottom.set_xlabel("allocation / free events, in order")
    for ax in (top, bottom):
        if estimated_peak:
            ax.axhline(estimated_peak / MIB, color="black", ls=":", lw=1.2, zorder=4,
                       label=f"estimated peak {_mib(estimated_peak)} MiB")
    if estimated_peak:
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    top.set_title(title or f"memory over one step ({tl.device})", fontsize=11)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp)
    return out


def timeline_title(model: str, batch: int, seq_len: int, dtype: str, device: str) -> str:
    """The standard title: what ran, so a PNG stands on its own."""
    return f"memory over one training step - {model}, batch {batch}, seq {seq_len}, {dtype}, {device}"
