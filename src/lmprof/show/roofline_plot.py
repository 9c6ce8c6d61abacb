"""A log-log roofline PNG: compute and bandwidth ceilings, one labelled point per block.

Uses matplotlib's Agg canvas directly (no global backend switch), so it works headless and does not
disturb a caller's own plotting.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from lmprof.estimate.roofline import RooflinePoint
from lmprof.atomic import atomic_path
from lmprof.units import si
from lmprof.show.literal import literal_text, plain_log_ticks

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_COLORS = {"compute-bound": "#1f77b4", "memory-bound": "#d62728", "overhead-bound": "#7f7f7f", "unknown": "#9467bd"}
_MARKERS = {"forward": "o", "prefill": "o", "backward": "s", "decode": "^"}



def y_range(ys: list[float], peak_flops: float, roof_at_xmin: float) -> tuple[float, float]:
    """The plot's FLOP/s range: every point and the whole roof inside it, with room above the
    highest; a point above the compute ceiling (a peak below what the device achieved) stays on the plot."""
    return min(min(ys), roof_at_xmin) / 4, max(max(ys), peak_flops) * 3


@literal_text
def plot_roofline(
    points: Sequence[RooflinePoint],
    *,
    peak_flops: float,
    peak_bytes_per_s: float,
    out: str | Path,
    device: str,
    dtype: str,
    model: str = "",
    phase: str = "",
    measured: bool = False,
    note: str | None = None,
) -> Path:
    """Write the roofline of ``points`` to ``out`` (PNG) and return its path.

    ``measured=False`` places each block on the roofline at its intensity (attainable FLOP/s) and
    says so in the title; ``measured=True`` places it at its achieved FLOP/s.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if peak_flops <= 0 or peak_bytes_per_s <= 0:
        raise ValueError("plot_roofline needs positive ceilings")
    ridge = peak_flops / peak_bytes_per_s
    drawable = [p for p in points if p.flops > 0 and p.bytes > 0 and math.isfinite(p.intensity)]
    skipped = [p for p in points if p not in drawable]

    def y_of(p: RooflinePoint) -> float | None:
        if measured:
            return p.achieved_flops_per_s if p.achieved_flops_per_s and p.achieved_flops_per_s > 0 else None
        return p.attainable_flops_per_s

    located = [(p, y_of(p)) for p in drawable]
    placed = [(p, y) for p, y in located if y]
    xs = [p.intensity for p, _ in placed] or [ridge]
    ys = [y for _, y in placed] or [peak_flops]
    xmin = min(min(xs), ridge) / 4
    xmax = max(max(xs), ridge) * 4
    ymin, ymax = y_range(ys, peak_flops, xmin * peak_bytes_per_s)

    fig = Figure(figsize=(10, 6.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, ax.yaxis)
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    # The roof: bandwidth slope up to the ridge, then the flat compute ceiling.
    ax.plot([xmin, ridge], [xmin * peak_bytes_per_s, peak_flops], color="#555555", lw=2,
            label=f"memory ceiling {si(peak_bytes_per_s, 'B/s')}")
    ax.plot([ridge, xmax], [peak_flops, peak_flops], color="black", lw=2,
            label=f"compute ceiling {si(peak_flops, 'FLOP/s')} ({dtype})")
    ax.axvline(ridge, color="black", lw=0.8, ls=":", label=f"ridge {ridge:.3g} FLOP/byte")
    phases = sorted({p.phase for p, _ in placed})
    show_phase = len(phases) > 1
    for p, y in placed:
        ax.scatter([p.intensity], [y], s=36, color=_COLORS.get(p.bound, "#333333"),
                   marker=_MARKERS.get(p.phase, "o"), zorder=3, edgecolors="white", linewidths=0.5)
    _label_points(ax, fig, placed, phases)

    ax.set_xlabel("Arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("Performance (FLOP/s)")
    what = "measured block times" if measured else "analytic: attainable, not measured"
    head = " ".join(s for s in (f"Roofline: {model}" if model else "Roofline", phase) if s)
    ax.set_title(f"{head} on {device}, {dtype}\n{what}", fontsize=11)
    ax.grid(True, which="major", ls="-", lw=0.4, alpha=0.5)
    ax.grid(True, which="minor", ls=":", lw=0.3, alpha=0.3)
    bounds = [b for b in _COLORS if any(p.bound == b for p, _ in placed)]
    handles = ax.get_legend_handles_labels()[0]
    handles += [Line2D([], [], ls="", marker="o", color=_COLORS[b], label=b) for b in bounds]
    if show_phase:
        handles += [Line2D([], [], ls="", marker=_MARKERS.get(ph, "o"), color="#444444", label=ph) for ph in phases]
    # Upper left is always empty on a roofline (above the bandwidth slope).
    ax.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.9)
    footer = []
    if skipped:
        footer.append("not drawn (no FLOPs or no bytes): " + ", ".join(sorted({p.name for p in skipped})))
    if note:
        footer.append(note)
    if footer:
        fig.text(0.01, 0.01, "\n".join(footer), fontsize=7, va="bottom", ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0.04 * len(footer), 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    return out


_SHORT_PHASE = {"forward": "fwd", "backward": "bwd", "prefill": "prefill", "decode": "decode"}


def _label_points(ax: Axes, fig: Figure, placed: Sequence[tuple[RooflinePoint, float]], phases: Sequence[str]) -> None:
    """Label points; points drawn on top of each other share one label ("ln_1, ln_2, ln_f").

    A block present in every phase at the same spot is named once; otherwise its phase is added.
    Each label goes to the candidate offset farthest from the labels already placed, so blocks of
    similar intensity (the big matmuls, the norms) stay readable.
    """
    fig.canvas.draw()
    to_px = ax.transData.transform
    groups: list[tuple[float, float, float, float, dict[str, set[str]]]] = []  # px, py, x, y, name -> phases
    for p, y in sorted(placed, key=lambda it: (it[0].intensity, it[1])):
        px, py = to_px((p.intensity, y))
        for g in groups:
            if abs(g[0] - px) < 8 and abs(g[1] - py) < 8:
                g[4].setdefault(p.name, set()).add(p.phase)
                break
        else:
            groups.append((px, py, p.intensity, y, {p.name: {p.phase}}))
    x_right = ax.transAxes.transform((0.78, 0))[0]
    px_per_pt = fig.dpi / 72.0
    right = [(6, 4), (6, -11), (6, 15), (6, -22), (6, 26), (6, -33)]
    left = [(-6, 4), (-6, -11), (-6, 15), (-6, -22), (-6, 26), (-6, -33)]
    taken: list[tuple[float, float]] = []
    for px, py, x, y, names in groups:
        parts = [n if len(ph) == len(phases) else n + " (" + "/".join(_SHORT_PHASE.get(q, q) for q in sorted(ph)) + ")"
                 for n, ph in names.items()]
        text = "\n".join(", ".join(parts[i:i + 3]) for i in range(0, len(parts), 3))
        candidates = (left + right) if px > x_right else (right + left)
        best, best_score = candidates[0], -1.0
        for dx, dy in candidates:
            cx, cy = px + dx * px_per_pt, py + dy * px_per_pt
            score = min((abs(cx - tx) / 80 + abs(cy - ty) / 12 for tx, ty in taken), default=1e9)
            if score > best_score + 1e-9:
                best, best_score = (dx, dy), score
            if score >= 1.5:
                break
        dx, dy = best
        taken.append((px + dx * px_per_pt, py + dy * px_per_pt))
        ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7.5,
                          ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top",
                          arrowprops=dict(arrowstyle="-", lw=0.4, color="#888888") if abs(dy) > 12 else None)
        ann.set_in_layout(False)  # labels must not shrink the axes in tight_layout
