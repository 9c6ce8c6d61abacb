"""Sweep plots that compare models: the radar of each model's best figures, and the roofline of every
ok run's blocks. Drawn by :func:`~lmprof.show.sweep_plots.make_plots`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lmprof import safejson
from lmprof.modes import traits
from lmprof.show.literal import plain_log_ticks
from lmprof.show.sweep_canvas import (
    SERIES_COLORS,
    THROUGHPUT,
    PlotOutcome,
    SweepData,
    energy_columns,
    model_order,
    new_figure,
    pick_column,
    save_figure,
    short_si,
    value_text,
)


# -- 6. radar per model ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RadarAxis:
    """One spoke: per model, the best value of a column over its ok runs."""

    label: str
    column: str
    higher_is_better: bool
    unit: str


def _radar_axes(data: SweepData, mode: str) -> tuple[list[RadarAxis], list[str]]:
    ok = data.ok[data.ok["mode"] == mode]
    axes: list[RadarAxis] = []
    missing: list[str] = []
    tp_col, tp_unit = THROUGHPUT[mode][0], "tokens/s"
    if pick_column(ok, [tp_col]):
        axes.append(RadarAxis("best throughput", tp_col, True, tp_unit))
    else:
        missing.append(f"throughput ({tp_col} n/a)")
    e_col, e_est = energy_columns(data.ok, mode, "per_token")
    mfu = pick_column(ok, ["mfu_pct"])
    if e_col:
        axes.append(RadarAxis("best efficiency" + (" (est.)" if e_est else ""), e_col, False, "J/token"))
    elif mfu:
        axes.append(RadarAxis("best efficiency (MFU)", mfu, True, "%"))
    else:
        missing.append("efficiency (no energy per token, no mfu)")
    mem = pick_column(ok, ["memory_peak_bytes", "memory_estimated_peak_bytes"])
    if mem:
        axes.append(RadarAxis("lowest memory" + (" (est.)" if "estimated" in mem else ""), mem, False, "B"))
    else:
        missing.append("memory (no memory.peak)")
    on_text = ok[[bool(safejson.loads(c).get("data")) for c in ok["config"]]] if not ok.empty else ok
    trains = traits(mode).trains
    if trains and pick_column(on_text, ["loss"]):
        axes.append(RadarAxis("lowest loss (on text)", "loss", False, "nats/token"))
    else:
        missing.append("loss (only for training on a text file: spec key data)" if trains else "loss (training only)")
    return axes, missing


def plot_radar(data: SweepData, mode: str, out: Path) -> PlotOutcome:
    """One polygon per model over its best figures; each axis scaled so the best model reaches 1."""
    name = f"radar_{mode}.png"
    ok = data.ok[data.ok["mode"] == mode]
    if ok.empty:
        return PlotOutcome(name, skipped=f"no ok {mode} runs")
    models = [m for m in model_order(data.runs) if m in set(ok["model"])]
    if len(models) < 2:
        return PlotOutcome(name, skipped=f"the radar compares models: only one model ({models[0]}) has ok {mode} runs")
    axes, missing = _radar_axes(data, mode)
    if len(axes) < 3:
        return PlotOutcome(name, skipped=f"a radar needs 3 axes with figures, {mode} runs have {len(axes)}: "
                                         f"missing {'; '.join(missing)}")
    best: dict[str, list[float | None]] = {}
    for m in models:
        rows = ok[ok["model"] == m]
        vals: list[float | None] = []
        for a in axes:
            use = rows
            if a.column == "loss":  # loss compares only where models trained on the same kind of data: text
                use = rows[[bool(safejson.loads(c).get("data")) for c in rows["config"]]]
            col = use[a.column].dropna()
            vals.append(None if col.empty else float(col.max() if a.higher_is_better else col.min()))
        best[m] = vals
    scores: dict[str, list[float]] = {m: [] for m in models}
    for i, a in enumerate(axes):
        present = [x for v in best.values() if (x := v[i]) is not None and x > 0]
        top = (max(present) if a.higher_is_better else min(present)) if present else None
        for m in models:
            v = best[m][i]
            if v is None or top is None or v <= 0:
                scores[m].append(0.0)  # drawn at the centre; the caption says which are missing
            else:
                scores[m].append(v / top if a.higher_is_better else top / v)
    from matplotlib.projections.polar import PolarAxes

    fig = new_figure(10, 8)
    # Fixed axes box (no tight_layout): the spoke labels sit outside the circle and need the margin.
    ax = fig.add_axes((0.22, 0.2, 0.56, 0.6), projection="polar")
    angles = [2 * math.pi * i / len(axes) for i in range(len(axes))]
    for i, m in enumerate(models):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        ring = scores[m] + scores[m][:1]
        ax.plot(angles + angles[:1], ring, color=color, lw=1.8, marker="o", label=m)
        ax.fill(angles + angles[:1], ring, color=color, alpha=0.12)
    tops = []
    for i, a in enumerate(axes):
        pairs = [(x, m) for m, v in best.items() if (x := v[i]) is not None and x > 0]
        pick = (max(pairs) if a.higher_is_better else min(pairs)) if pairs else None
        tops.append(f"best: {value_text(pick[0], a.unit)} ({pick[1]})" if pick else "no figures")
    ax.set_xticks(angles)
    ax.set_xticklabels([])
    for angle, a, best_text in zip(angles, axes, tops):
        # Labels placed by hand, anchored away from the circle (tick labels centre on the rim).
        c, s_ = math.cos(angle), math.sin(angle)
        ha = "left" if c > 0.1 else "right" if c < -0.1 else "center"
        va = "bottom" if s_ > 0.1 else "top" if s_ < -0.1 else "center"
        ax.text(angle, 1.12, f"{a.label}\n({'higher' if a.higher_is_better else 'lower'} is better)\n{best_text}",
                ha=ha, va=va, fontsize=8.5, clip_on=False)
    ax.set_ylim(0, 1.05)
    ax.set_yticks([0.25, 0.5, 0.75, 1.0])
    ax.set_yticklabels(["0.25", "0.5", "0.75", "1 = best"], fontsize=7, color="#555555")
    assert isinstance(ax, PolarAxes)  # added with projection="polar" above
    ax.set_rlabel_position(360 / len(axes) / 2)  # between two spokes, clear of the axis labels
    fig.legend(loc="upper right", bbox_to_anchor=(0.98, 0.9), fontsize=8.5, title="model")
    fig.suptitle(f"Models compared, {mode}: the best figure of each model over its ok runs", fontsize=11, y=0.975)
    absent = [f"{m}: {axes[i].label}" for m in models for i, v in enumerate(best[m]) if v is None]
    foot = [
        "Each axis is scaled to the best model = 1 (outer ring); lower-is-better axes use best/value, so outward is "
        "always better.",
        "Failed runs (oom, timeout, error) are excluded, not counted as infinitely bad. "
        + (f"No figure (drawn at the centre): {', '.join(absent)}." if absent else ""),
        ("Axes left out: " + "; ".join(missing)) if missing else "",
    ]
    return PlotOutcome(name, save_figure(fig, out / name, foot, layout=False))


# -- 7. roofline of every run's blocks ------------------------------------------------------------
def plot_roofline(data: SweepData, out: Path) -> PlotOutcome:
    """Every ok run's blocks at (FLOP/byte, achieved FLOP/s), with the runs' peak ceilings if known."""
    name = "roofline.png"
    b = data.blocks
    if "flops" not in b.columns or b.empty:
        return PlotOutcome(name, skipped="no per-block rows in the ok runs")
    pts = b[b["flops"].notna() & b["bytes"].notna() & (b["flops"] > 0) & (b["bytes"] > 0) & (b["time_ms"] > 0)]
    if pts.empty:
        return PlotOutcome(name, skipped="no block carries both flops and bytes (FLOP/byte counting was not in "
                                         "these runs), so blocks cannot be placed on a roofline")
    pts = pts.assign(intensity=pts["flops"] / pts["bytes"], achieved=pts["flops"] / (pts["time_ms"] / 1e3))
    ceilings = _ceilings(data)
    fig = new_figure(12.5, 7)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, ax.yaxis)
    xs, ys = list(pts["intensity"]), list(pts["achieved"])
    xmin, xmax = min(xs) / 3, max(xs) * 3
    for (_, flops_peak, bw) in ceilings:
        xmin, xmax = min(xmin, flops_peak / bw / 4), max(xmax, flops_peak / bw * 4)
    styles = ("-", "--", ":", "-.")
    for i, (label, flops_peak, bw) in enumerate(ceilings):
        ridge = flops_peak / bw
        ls = styles[i % len(styles)]
        ax.plot([xmin, ridge, xmax], [xmin * bw, flops_peak, flops_peak], color="black", lw=1.6, ls=ls,
                label=f"roof {label}: {short_si(flops_peak, 'FLOP/s')}, {short_si(bw, 'B/s')}")
    pts = pts.assign(family=[_family(n) for n in pts["name"]])
    fam_colors = {"attention (attn.*)": "#e6550d", "MLP (mlp.*)": "#2171b5", "norms (ln_*)": "#31a354",
                  "embedding / lm_head / loss": "#756bb1", "other": "#7f7f7f"}
    markers = {"forward": "o", "backward": "s", "prefill": "^", "decode": "v", "step": "D"}
    for (fam, phase), g in pts.groupby(["family", "phase"]):
        ax.scatter(g["intensity"], g["achieved"], s=22, color=fam_colors[fam], marker=markers.get(phase, "o"),
                   alpha=0.75, edgecolors="white", linewidths=0.4)
    from matplotlib.lines import Line2D

    handles = ax.get_legend_handles_labels()[0]
    handles += [Line2D([], [], ls="", marker="o", color=c, label=f) for f, c in fam_colors.items()
                if f in set(pts["family"])]
    handles += [Line2D([], [], ls="", marker=markers.get(p, "o"), color="#444444", label=f"phase: {p}")
                for p in sorted(pts["phase"].unique())]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, framealpha=0.9)
    ax.set_xlim(xmin, xmax)
    top = max([c[1] for c in ceilings] + ys) * 3
    ax.set_ylim(min(ys + [xmin * c[2] for c in ceilings]) / 3, top)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved performance (FLOP/s)")
    n_runs = pts["point_id"].nunique()
    ax.set_title(f"Roofline: every block of {n_runs} ok runs (achieved FLOP/s = block FLOPs / block time)", fontsize=11)
    ax.grid(True, which="major", lw=0.4, alpha=0.5)
    foot = ["Block time is the block's share of the profiled step applied to the clean step time; a point above "
            "the roof means that share or the peak figure is off, not that the roof was beaten.",
            "no peak.flops / peak.bandwidth in the runs: ceilings not drawn" if not ceilings else
            "Ceilings: the runs' peak.flops and peak.bandwidth metrics.",
            *data.footer()]
    return PlotOutcome(name, save_figure(fig, out / name, foot))


def _family(name: str) -> str:
    if name.startswith("attn."):
        return "attention (attn.*)"
    if name.startswith("mlp."):
        return "MLP (mlp.*)"
    if name.startswith("ln_"):
        return "norms (ln_*)"
    if name in ("embedding", "lm_head", "loss"):
        return "embedding / lm_head / loss"
    return "other"


def _ceilings(data: SweepData) -> list[tuple[str, float, float]]:
    """Distinct (device dtype, peak FLOP/s, peak B/s) over the ok runs that report both peaks."""
    ok = data.ok
    if "peak_flops_flop_per_s" not in ok.columns or "peak_bandwidth_bytes_per_s" not in ok.columns:
        return []
    rows = ok[ok["peak_flops_flop_per_s"].notna() & ok["peak_bandwidth_bytes_per_s"].notna()]
    seen: dict[tuple[float, float], str] = {}
    for _, r in rows.iterrows():
        key = (float(r["peak_flops_flop_per_s"]), float(r["peak_bandwidth_bytes_per_s"]))
        seen.setdefault(key, f"{r['device_name'] or r['dev']} {r['dtype']}")
    return [(label, f, bw) for (f, bw), label in seen.items()]
