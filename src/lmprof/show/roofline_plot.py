"""A log-log roofline PNG: compute and bandwidth ceilings, one labelled point per block.

Uses matplotlib's Agg canvas directly (no global backend switch), so it works headless and does not
disturb a caller's own plotting.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from lmprof.analysis.roofline import RooflinePoint

_COLORS = {"compute-bound": "#1f77b4", "memory-bound": "#d62728", "overhead-bound": "#7f7f7f", "unknown": "#9467bd"}
_MARKERS = {"forward": "o", "prefill": "o", "backward": "s", "decode": "^"}


def _eng(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


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

    placed = [(p, y_of(p)) for p in drawable]
    placed = [(p, y) for p, y in placed if y]
    xs = [p.intensity for p, _ in placed] or [ridge]
    ys = [y for _, y in placed] or [peak_flops]
    xmin = min(min(xs), ridge) / 4
    xmax = max(max(xs), ridge) * 4
    ymin = min(min(ys), xmin * peak_bytes_per_s) / 4
    ymax = peak_flops * 3

    fig = Figure(figsize=(10, 6.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    # The roof: bandwidth slope up to the ridge, then the flat compute ceiling.
    ax.plot([xmin, ridge], [xmin * peak_bytes_per_s, peak_flops], color="black", lw=2)
    ax.plot([ridge, xmax], [peak_flops, peak_flops], color="black", lw=2)
    ax.axvline(ridge, color="black", lw=0.8, ls=":")
    ax.text(ridge * 1.08, ymin * 1.6, f"ridge {ridge:.3g} FLOP/byte", fontsize=8, rotation=90, va="bottom")
    ax.text(xmax / 1.15, peak_flops * 1.15, f"compute ceiling {_eng(peak_flops, 'FLOP/s')} ({dtype})",
            ha="right", va="bottom", fontsize=9)
    x_text = xmin * 1.6
    ax.text(x_text, x_text * peak_bytes_per_s * 1.3, f"memory ceiling {_eng(peak_bytes_per_s, 'B/s')}",
            fontsize=9, rotation=_slope_angle(ax, fig), rotation_mode="anchor", va="bottom")

    phases = sorted({p.phase for p, _ in placed})
    show_phase = len(phases) > 1
    for p, y in placed:
        ax.scatter([p.intensity], [y], s=36, color=_COLORS.get(p.bound, "#333333"),
                   marker=_MARKERS.get(p.phase, "o"), zorder=3, edgecolors="white", linewidths=0.5)
    _label_points(ax, fig, [(p, y, f"{p.name} ({p.phase[:3]})" if show_phase else p.name) for p, y in placed])

    ax.set_xlabel("Arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("Performance (FLOP/s)")
    what = "measured block times" if measured else "analytic: attainable, not measured"
    head = " ".join(s for s in (f"Roofline: {model}" if model else "Roofline", phase) if s)
    ax.set_title(f"{head} on {device}, {dtype}\n{what}", fontsize=11)
    ax.grid(True, which="major", ls="-", lw=0.4, alpha=0.5)
    ax.grid(True, which="minor", ls=":", lw=0.3, alpha=0.3)
    bounds = [b for b in _COLORS if any(p.bound == b for p, _ in placed)]
    handles = [Line2D([], [], ls="", marker="o", color=_COLORS[b], label=b) for b in bounds]
    if show_phase:
        handles += [Line2D([], [], ls="", marker=_MARKERS.get(ph, "o"), color="#444444", label=ph) for ph in phases]
    if handles:
        ax.legend(handles=handles, loc="lower right", fontsize=8, framealpha=0.85)
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
    fig.savefig(out, format="png")
    return out


def _slope_angle(ax, fig) -> float:  # type: ignore[no-untyped-def]
    """On-screen angle (degrees) of a slope-1 line in log-log axes, to lay text along the roof."""
    fig.canvas.draw()
    (x0, y0), (x1, y1) = ax.transAxes.transform([(0, 0), (1, 1)])
    xl, yl = ax.get_xlim(), ax.get_ylim()
    dx = (x1 - x0) / math.log10(xl[1] / xl[0])
    dy = (y1 - y0) / math.log10(yl[1] / yl[0])
    return math.degrees(math.atan2(dy, dx))


def _label_points(ax, fig, items) -> None:  # type: ignore[no-untyped-def]
    """Label points, nudging each label to the candidate offset farthest from labels already placed.

    Blocks often share an intensity (ln_1, ln_2 and ln_f; the big matmuls), so plain labels pile up.
    """
    fig.canvas.draw()
    to_px = ax.transData.transform
    candidates = [(6, 4), (6, -11), (-6, 4), (-6, -11), (6, 15), (6, -22), (-6, 15), (-6, -22), (6, 26), (6, -33)]
    px_per_pt = fig.dpi / 72.0
    taken: list[tuple[float, float]] = []
    for p, y, text in sorted(items, key=lambda it: (it[0].intensity, it[1])):
        px, py = to_px((p.intensity, y))
        best, best_score = candidates[0], -1.0
        for dx, dy in candidates:
            cx, cy = px + dx * px_per_pt, py + dy * px_per_pt
            score = min((abs(cx - tx) / 60 + abs(cy - ty) / 10 for tx, ty in taken), default=1e9)
            if score > best_score + 1e-9:
                best, best_score = (dx, dy), score
            if score >= 1.5:
                break
        dx, dy = best
        taken.append((px + dx * px_per_pt, py + dy * px_per_pt))
        ax.annotate(text, (p.intensity, y), xytext=(dx, dy), textcoords="offset points", fontsize=7.5,
                    ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top",
                    arrowprops=dict(arrowstyle="-", lw=0.4, color="#888888") if abs(dy) > 12 else None)
