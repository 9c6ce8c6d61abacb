"""PNG plots of a finished sweep, from its ``results.sqlite`` (see docs/sweeps.md, "Plots").

Every plot uses ``ok`` runs only: a failed point (oom, timeout, error) has no figures, and it is left
out and counted in the plot's footer, never drawn as zero or infinity. Figures that no run measured
(``n/a``) are left out the same way. A plot that cannot be drawn from what the sweep measured is
skipped with the reason, which the caller prints.

Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lmprof.atomic import atomic_path
from lmprof.names import FORWARD_BLOCKS, IDLE, PHASE_ROWS
from lmprof.names import MODE_PHASES as PHASES
from lmprof.record.catalogue import throughput
from lmprof.show.literal import literal_text

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The product's axes that tell configurations apart (repeats of one configuration are aggregated).
CONFIG_AXES = ("mode", "model", "dev", "dtype", "compile", "attention", "batch_size", "seq_len")
PER = {"train": "ms per training step", "infer": "ms per generation"}
# The catalogue's throughput figure per mode: (column, axis label).
THROUGHPUT = {mode: (throughput(mode).name, f"{mode}: {throughput(mode).label} ({throughput(mode).unit})")
              for mode in ("train", "infer")}
BLOCK_ORDER = (*FORWARD_BLOCKS, *PHASE_ROWS, IDLE)
_FIXED_COLORS = {
    "embedding": "#8c6bb1", "ln_1": "#a1d99b", "attn.qkv": "#fdae6b", "attn.scores": "#fd8d3c",
    "attn.softmax": "#e6550d", "attn.av": "#a63603", "attn.sdpa": "#cb181d", "attn.proj": "#fdd0a2",
    "residual": "#bdbdbd", "ln_2": "#74c476", "moe.router": "#fee391", "moe.experts": "#41b6c4", "mlp.fc": "#6baed6", "mlp.act": "#2171b5", "mlp.proj": "#08306b",
    "ln_f": "#31a354", "lm_head": "#807dba", "loss": "#54278f", "accumulate_grad": "#969696",
    "model_glue": "#c7e9c0", "autograd_engine": "#bcbddc", "other": "#d9d9d9", "idle": "#f0f0f0",
}
_EXTRA_COLORS = ("#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1b9e77", "#7570b3", "#d95f02", "#666666")
_SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
_SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_AXIS_NAME = {"dev": "device", "batch_size": "batch size", "seq_len": "sequence length"}
_AXIS_TEXT = {"batch_size": "batch size (sequences)", "seq_len": "sequence length (tokens; infer: prompt tokens)"}


@dataclass(frozen=True)
class PlotOutcome:
    """One plot: the file written, or the reason it was skipped."""

    name: str
    path: Path | None = None
    skipped: str | None = None


@dataclass
class SweepData:
    """The sweep's runs (one row per point) and the per-block rows of its ok runs."""

    runs: "pd.DataFrame"
    blocks: "pd.DataFrame"
    notes: Callable[[str], dict[str, int]]

    @property
    def ok(self) -> "pd.DataFrame":
        ok: pd.DataFrame = self.runs[self.runs["status"] == "ok"]  # a boolean mask selects rows: a DataFrame
        return ok

    def footer(self, mode: str | None = None) -> list[str]:
        """Footer lines every plot carries: failed runs left out, noisy runs kept (and marked)."""
        return [self.failed_note(mode), self.noisy_note(mode)]

    def noisy_note(self, mode: str | None = None) -> str:
        """Footer text: which ok runs judged their own timing noisy (run.json ``noisy``), or ''."""
        ok = self.ok if mode is None else self.ok[self.ok["mode"] == mode]
        if "noisy" not in ok.columns:
            return ""
        bad = ok[ok["noisy"] == 1]
        if bad.empty:
            return ""
        named = ", ".join(str(x) for x in bad["label"].head(4))
        more = f", +{len(bad) - 4} more" if len(bad) > 4 else ""
        return (f"noisy runs kept, timing less certain ({len(bad)} of {len(ok)}; ringed in line plots; "
                f"reasons in each run.json): {named}{more}")

    def failed_note(self, mode: str | None = None) -> str:
        """Footer text: how many failed runs were left out (by status), or ''."""
        runs = self.runs if mode is None else self.runs[self.runs["mode"] == mode]
        bad = runs[runs["status"].isin(["oom", "timeout", "error"])]
        if bad.empty:
            return ""
        by = ", ".join(f"{n} {s}" for s, n in sorted(bad["status"].value_counts().items()))
        named = [f"{r['label']} ({r['status']})" for _, r in bad.head(4).iterrows()]
        more = f", +{len(bad) - 4} more" if len(bad) > 4 else ""
        return f"failed runs left out ({by}): {', '.join(named)}{more}"


def load_sweep(folder: str | Path) -> SweepData:
    """Read a sweep folder's store into the frames the plots use."""
    from lmprof.record.store import load_blocks, load_metric_notes, load_results

    runs = load_results(folder)
    runs["dev"] = runs["device_resolved"].where(runs["device_resolved"].notna(), runs["device"])
    blocks = load_blocks(folder)
    blocks["dev"] = blocks["device_resolved"].where(blocks["device_resolved"].notna(), blocks["device"])
    return SweepData(runs=runs, blocks=blocks, notes=lambda prefix: load_metric_notes(folder, prefix))


# -- small helpers --------------------------------------------------------------------------------
def _figure(width: float, height: float) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


@dataclass(frozen=True)
class SideLegend:
    """One legend for the whole figure, in a right margin ``width`` inches wide."""

    handles: dict[str, Any]
    order: Sequence[str]
    title: str | None
    width: float = 1.7


def _save(fig: "Figure", path: Path, footer: Sequence[str] = (), legend: SideLegend | None = None,
          layout: bool = True) -> Path:
    """Lay out (unless the caller placed the axes), add the side legend and footer lines, write the PNG."""
    lines = [f for f in footer if f]
    right = 1 - legend.width / fig.get_figwidth() if legend else 1.0
    if layout:
        fig.tight_layout(rect=(0, 0.022 * len(lines) + (0.01 if lines else 0), right, 1))
    if legend:
        keys = [k for k in legend.order if k in legend.handles]
        if keys:
            fig.legend([legend.handles[k] for k in keys], keys, loc="center left",
                       bbox_to_anchor=(right + 0.005, 0.5), fontsize=7.5, title=legend.title, title_fontsize=8)
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=7.5, va="bottom", ha="left", color="#444444")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def _handles(axes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ax in getattr(axes, "flat", axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            out.setdefault(label, h)
    return out


def _repeats_text(data: "SweepData") -> str:
    n = int(data.ok["repeat"].max()) + 1 if not data.ok.empty else 1
    return f"median of {n} repeats" if n > 1 else "one run per configuration"


def _varying(df: "pd.DataFrame", axes: Sequence[str]) -> list[str]:
    return [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]


def _axis_text(axis: str, value: Any) -> str:
    if axis == "batch_size":
        return f"b{value}"
    if axis == "seq_len":
        return f"t{value}"
    if axis == "compile":
        return "compiled" if value else "eager"
    return str(value)


def _natural_key(text: str) -> list[Any]:
    """Sort 'b2 t64' before 'b16 t32': digit runs compare as numbers."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _config_label(row: Any, axes: Sequence[str]) -> str:
    return " ".join(_axis_text(a, row[a]) for a in axes) or "all runs"


def _median_by_config(df: "pd.DataFrame", values: Sequence[str]) -> "pd.DataFrame":
    """One row per configuration: the median of its repeats, NaN (n/a) values ignored."""
    keys = [a for a in CONFIG_AXES if a in df.columns]
    groups = df.groupby(keys, dropna=False, sort=False)
    out = groups[list(values)].median()
    # a configuration is marked noisy when any of its repeats was
    out["any_noisy"] = groups["noisy"].max().fillna(0) > 0 if "noisy" in df.columns else False
    table: pd.DataFrame = out.reset_index()  # the group keys back as columns
    return table


def _model_order(runs: "pd.DataFrame") -> list[str]:
    """Models from smallest to largest by parameter count (unknown sizes last), then by name."""
    sizes = runs.groupby("model")["params"].max() if "params" in runs.columns else None

    def key(m: str) -> tuple[float, str]:
        size = sizes.get(m) if sizes is not None else None
        return (float(size) if size is not None and not math.isnan(size) else math.inf, str(m))

    return sorted(runs["model"].unique(), key=key)


def _block_colors(names: Sequence[str]) -> dict[str, str]:
    colors, extra = {}, iter(_EXTRA_COLORS * 8)
    for n in names:
        colors[n] = _FIXED_COLORS.get(n) or next(extra)
    return colors


def _block_sorted(names: Sequence[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(BLOCK_ORDER)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def _pick_column(df: "pd.DataFrame", candidates: Sequence[str]) -> str | None:
    """The first candidate column that has at least one value."""
    for c in candidates:
        if c in df.columns and df[c].notna().any():
            return c
    return None


def _na_reason(data: SweepData, prefix: str, what: str) -> str:
    notes = data.notes(prefix)
    if notes:
        top = sorted(notes.items(), key=lambda kv: -kv[1])
        text = "; ".join(f"{n} ({c} runs)" for n, c in top[:2])
        return f"no {what} measured: {text}"
    return f"no {what} in any ok run (no run has {prefix}* metrics)"


def _log2_axis(ax: "Axes", values: Sequence[float]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    vals = sorted({float(v) for v in values})
    if len(vals) > 1 and vals[0] > 0 and vals[-1] / vals[0] >= 4:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.set_xticklabels([f"{v:g}" for v in vals])
    # The same x range in every panel, even where a model has runs at one value only.
    if ax.get_xscale() == "log":
        ax.set_xlim(vals[0] / 1.25, vals[-1] * 1.25)
    else:
        pad = (vals[-1] - vals[0]) * 0.06 or 1.0
        ax.set_xlim(vals[0] - pad, vals[-1] + pad)


# -- 1. stacked per-block time per configuration --------------------------------------------------
def plot_blocks(data: SweepData, mode: str, out: Path, share: bool = False) -> PlotOutcome:
    """Stacked horizontal bars: every block's time in each phase, one bar per configuration.

    ``share=True`` draws each bar as percentages of its phase, so configurations of very different
    sizes can be compared by where their time goes.
    """
    name = f"blocks_{'share_' if share else ''}{mode}.png"
    blocks = data.blocks[(data.blocks["mode"] == mode) & data.blocks["phase"].isin(PHASES[mode])]
    if blocks.empty:
        return PlotOutcome(name, skipped=f"no ok {mode} runs with per-block times")
    keys = [a for a in CONFIG_AXES if a in blocks.columns]
    per_run = blocks.groupby(["point_id", *keys, "phase", "name"], dropna=False, sort=False)["time_ms"].sum()
    table = per_run.groupby([*keys, "phase", "name"], dropna=False, sort=False).median().reset_index()
    configs = table[keys].drop_duplicates().reset_index(drop=True)
    label_axes = _varying(configs, keys)
    configs["label"] = [_config_label(r, label_axes) for _, r in configs.iterrows()]
    table = table.merge(configs, on=keys)
    names = _block_sorted(table["name"])
    colors = _block_colors(names)
    labels = list(configs["label"])
    n = len(labels)
    fig = _figure(13, max(3.4, 0.32 * n + 2.4))
    axes = fig.subplots(1, len(PHASES[mode]), sharey=True, squeeze=False)[0]
    for ax, phase in zip(axes, PHASES[mode]):
        sub = table[table["phase"] == phase].pivot_table(index="label", columns="name", values="time_ms", aggfunc="sum")
        sub = sub.reindex(index=labels, columns=[c for c in names if c in sub.columns]).fillna(0.0)
        if share:
            totals = sub.sum(axis=1).replace(0.0, float("nan"))
            sub = sub.div(totals, axis=0).fillna(0.0) * 100.0
        left = [0.0] * n
        for col in sub.columns:
            vals = list(sub[col])
            ax.barh(range(n), vals, left=left, color=colors[col], label=col, edgecolor="white", linewidth=0.3)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_title(phase)
        ax.set_xlabel(f"share of the {phase} phase (%)" if share else f"time ({PER[mode]})")
        if share:
            ax.set_xlim(0, 100)
        ax.grid(True, axis="x", lw=0.4, alpha=0.5)
    axes[0].set_yticks(range(n))
    axes[0].set_yticklabels(labels, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("configuration")
    what = " and ".join(PHASES[mode])
    unit = "% of each phase" if share else PER[mode]
    fig.suptitle(f"Per-block time per configuration, {mode}: {what}\n({unit}; {_repeats_text(data)})", fontsize=11)
    foot = ["optimizer, data and zero_grad (the step phase) are not shown" if mode == "train" else "",
            *data.footer(mode)]
    return PlotOutcome(name, _save(fig, out / name, foot, SideLegend(_handles(axes), names, "block", 1.9)))


# -- 2. attention and MLP sub-blocks per model and device -----------------------------------------
def plot_subblocks(data: SweepData, mode: str, family: str, out: Path) -> PlotOutcome:
    """Stacked bars of one family's sub-blocks (``attn.*`` or ``mlp.*``): grid of device x model."""
    title = {"attn": "Attention", "mlp": "MLP"}[family]
    name = f"{'attention' if family == 'attn' else 'mlp'}_{mode}.png"
    blocks = data.blocks[(data.blocks["mode"] == mode) & data.blocks["name"].str.startswith(family + ".")]
    if blocks.empty:
        return PlotOutcome(name, skipped=f"no ok {mode} runs with {family}.* blocks")
    keys = [a for a in CONFIG_AXES if a in blocks.columns]
    per_run = blocks.groupby(["point_id", *keys, "name"], dropna=False, sort=False)["time_ms"].sum()
    table = per_run.groupby([*keys, "name"], dropna=False, sort=False).median().reset_index()
    models = [m for m in _model_order(data.runs) if m in set(table["model"])]
    devices = sorted(table["dev"].unique(), key=str)
    inner = _varying(table[keys].drop_duplicates(), [k for k in keys if k not in ("mode", "model", "dev")])
    names = _block_sorted(table["name"])
    colors = _block_colors(names)
    n_cfg = max(len(table[table["model"] == m][inner].drop_duplicates()) if inner else 1 for m in models)
    fig = _figure(max(8.0, 3.0 + len(models) * max(3.4, 0.45 * n_cfg)), 2.4 + 3.4 * len(devices))
    grid = fig.subplots(len(devices), len(models), squeeze=False)
    for r, dev in enumerate(devices):
        for c, model in enumerate(models):
            ax = grid[r][c]
            sub = table[(table["dev"] == dev) & (table["model"] == model)]
            ax.set_title(f"{model} on {dev}", fontsize=9.5)
            if sub.empty:
                ax.text(0.5, 0.5, "no ok runs", ha="center", va="center", transform=ax.transAxes, color="#777777")
                ax.set_xticks([])
                continue
            cfgs = sub[inner].drop_duplicates() if inner else sub[keys].drop_duplicates().head(1)
            labels = [_config_label(row, inner) for _, row in cfgs.iterrows()]
            sub = sub.assign(label=[_config_label(row, inner) for _, row in sub.iterrows()])
            wide = sub.pivot_table(index="label", columns="name", values="time_ms", aggfunc="sum")
            wide = wide.reindex(index=labels, columns=[n for n in names if n in wide.columns]).fillna(0.0)
            bottom = [0.0] * len(labels)
            for col in wide.columns:
                vals = list(wide[col])
                ax.bar(range(len(labels)), vals, bottom=bottom, color=colors[col], label=col, edgecolor="white",
                       linewidth=0.3)
                bottom = [a + b for a, b in zip(bottom, vals)]
            ax.set_xticks(range(len(labels)))
            tilt = n_cfg > 3  # the same for every panel of the figure
            ax.set_xticklabels(labels, rotation=40 if tilt else 0, ha="right" if tilt else "center", fontsize=7.5)
            ax.set_ylabel(f"{family}.* time ({PER[mode]})", fontsize=8.5)
            ax.set_xlabel("configuration", fontsize=8.5)
            ax.grid(True, axis="y", lw=0.4, alpha=0.5)
    phases = " + ".join(PHASES[mode])
    fig.suptitle(f"{title} sub-blocks per model and device, {mode}\n({phases}; {PER[mode]}; {_repeats_text(data)})",
                 fontsize=10.5)
    legend = SideLegend(_handles(grid), names, "sub-block", 1.6)
    return PlotOutcome(name, _save(fig, out / name, data.footer(mode), legend))


# -- 3-5. a metric against batch size or sequence length ------------------------------------------
def plot_metric_vs(
    data: SweepData,
    x: str,
    metric_by_mode: dict[str, str],
    ylabel_by_mode: dict[str, str],
    title: str,
    name: str,
    out: Path,
) -> PlotOutcome:
    """Lines of a metric against ``x`` (batch_size or seq_len): rows = modes, columns = models.

    One line per combination of the other axes that vary in the sweep; n/a values are left out.
    """
    ok = data.ok
    panels = []
    for mode, col in metric_by_mode.items():
        sub = ok[(ok["mode"] == mode)] if col in ok.columns else ok.iloc[0:0]
        sub = sub[sub[col].notna()] if col in sub.columns else sub
        if not sub.empty:
            panels.append((mode, col, sub))
    if not panels:
        wanted = " / ".join(sorted(set(metric_by_mode.values())))
        return PlotOutcome(name, skipped=f"no ok run has a value for {wanted}")
    xs = sorted({v for _, _, sub in panels for v in sub[x].unique()})
    if len(xs) < 2:
        return PlotOutcome(name, skipped=f"only one {x.replace('_', ' ')} ({xs[0]}) among the runs with these figures")
    models = [m for m in _model_order(data.runs) if any(m in set(sub["model"]) for _, _, sub in panels)]
    fig = _figure(max(8.0, 3.2 + 4.2 * len(models)), 1.6 + 3.4 * len(panels))
    grid = fig.subplots(len(panels), len(models), squeeze=False)
    others = [a for a in CONFIG_AXES if a not in ("mode", "model", x)]
    series_axes = _varying(ok, others)
    # Colours fixed per series over the whole figure, in sorted order, so every panel agrees.
    meds = [_median_by_config(sub, [col]) for _, col, sub in panels]
    labels = sorted({_config_label(row, series_axes) for med in meds for _, row in med.iterrows()},
                    key=_natural_key)
    styles = {lab: (_SERIES_COLORS[i % len(_SERIES_COLORS)], _SERIES_MARKERS[i % len(_SERIES_MARKERS)])
              for i, lab in enumerate(labels)}
    for r, ((mode, col, _sub), med) in enumerate(zip(panels, meds)):
        for c, model in enumerate(models):
            ax = grid[r][c]
            m = med[med["model"] == model]
            ax.set_title(f"{model}, {mode}", fontsize=9.5)
            if m.empty:
                ax.text(0.5, 0.5, "no ok runs", ha="center", va="center", transform=ax.transAxes, color="#777777")
            groups = m.groupby(series_axes, dropna=False, sort=True) if series_axes else [((), m)]
            for _key, g in groups:
                g = g.sort_values(x)
                label = _config_label(g.iloc[0], series_axes)
                color, marker = styles[label]
                ax.plot(g[x], g[col], marker=marker, color=color, label=label, lw=1.4, ms=5)
                shaky = g[g["any_noisy"]]
                if not shaky.empty:  # a ring around points whose timing was noisy (see the footer)
                    ax.plot(shaky[x], shaky[col], ls="", marker="o", ms=11, mfc="none", mec="#d62728", mew=1.2)
            _log2_axis(ax, xs)
            ax.set_xlabel(_AXIS_TEXT[x], fontsize=8.5)
            ax.set_ylabel(ylabel_by_mode[mode], fontsize=8.5)
            ax.set_ylim(bottom=0)
            ax.grid(True, lw=0.4, alpha=0.5)
    fig.suptitle(f"{title}\n({_repeats_text(data)}; n/a values left out)", fontsize=11)
    legend = (SideLegend(_handles(grid), list(styles), ", ".join(_AXIS_NAME.get(a, a) for a in series_axes))
              if series_axes else None)
    return PlotOutcome(name, _save(fig, out / name, data.footer(), legend))


def _energy_columns(ok: "pd.DataFrame", mode: str, kind: str) -> tuple[str | None, bool]:
    """The energy column for a mode: measured first, then estimated; (column, estimated?)."""
    if kind == "per_token":
        measured = ["energy_per_token_j", "energy_per_generated_token_j"]
        estimated = ["energy_estimated_per_token_j", "energy_estimated_per_generated_token_j"]
    else:
        measured = ["energy_flop_per_joule", "energy_flops_per_joule"]
        estimated = ["energy_estimated_flop_per_joule", "energy_estimated_flops_per_joule"]
    sub = ok[ok["mode"] == mode]
    col = _pick_column(sub, measured)
    if col:
        return col, False
    col = _pick_column(sub, estimated)
    return col, col is not None


def plot_energy(data: SweepData, kind: str, out: Path) -> PlotOutcome:
    """Energy per token, or FLOPs per joule, against batch size (only where energy was measured)."""
    name = "energy_per_token_vs_batch.png" if kind == "per_token" else "flop_per_joule_vs_batch.png"
    cols, est = {}, []
    for mode in PHASES:
        col, is_est = _energy_columns(data.ok, mode, kind)
        if col:
            cols[mode] = col
            est.append(is_est)
    if not cols:
        what = "energy per token" if kind == "per_token" else "FLOPs per joule"
        return PlotOutcome(name, skipped=_na_reason(data, "energy.", what))
    source = "estimated" if all(est) else "measured" if not any(est) else "measured or estimated"
    if kind == "per_token":
        ylabels = {m: f"{m}: J per {'generated ' if m == 'infer' else ''}token" for m in cols}
        title = f"Energy per token vs batch size, per model ({source}; lower is better)"
    else:
        ylabels = {m: f"{m}: FLOP per J" for m in cols}
        title = f"FLOPs per joule vs batch size, per model ({source}; higher is better)"
    return plot_metric_vs(data, "batch_size", cols, ylabels, title, name, out)


def plot_mfu(data: SweepData, out: Path) -> PlotOutcome:
    """MFU (%) against batch size; skipped with the reason when no run has an MFU figure."""
    name = "mfu_vs_batch.png"
    if not _pick_column(data.ok, ["mfu_pct"]):
        return PlotOutcome(name, skipped=_na_reason(data, "mfu", "MFU"))
    modes = [m for m in PHASES if m in set(data.ok["mode"])]
    return plot_metric_vs(data, "batch_size", {m: "mfu_pct" for m in modes}, {m: f"{m}: MFU (%)" for m in modes},
                          "Model FLOPs utilisation (MFU) vs batch size, per model", name, out)


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
    if _pick_column(ok, [tp_col]):
        axes.append(RadarAxis("best throughput", tp_col, True, tp_unit))
    else:
        missing.append(f"throughput ({tp_col} n/a)")
    e_col, e_est = _energy_columns(data.ok, mode, "per_token")
    mfu = _pick_column(ok, ["mfu_pct"])
    if e_col:
        axes.append(RadarAxis("best efficiency" + (" (est.)" if e_est else ""), e_col, False, "J/token"))
    elif mfu:
        axes.append(RadarAxis("best efficiency (MFU)", mfu, True, "%"))
    else:
        missing.append("efficiency (no energy per token, no mfu)")
    mem = _pick_column(ok, ["memory_peak_bytes", "memory_estimated_peak_bytes"])
    if mem:
        axes.append(RadarAxis("lowest memory" + (" (est.)" if "estimated" in mem else ""), mem, False, "B"))
    else:
        missing.append("memory (no memory.peak)")
    on_text = ok[[bool(json.loads(c).get("data")) for c in ok["config"]]] if not ok.empty else ok
    if mode == "train" and _pick_column(on_text, ["loss"]):
        axes.append(RadarAxis("lowest loss (on text)", "loss", False, "nats/token"))
    else:
        missing.append("loss (only for training on a text file: spec key data)" if mode == "train"
                       else "loss (training only)")
    return axes, missing


def plot_radar(data: SweepData, mode: str, out: Path) -> PlotOutcome:
    """One polygon per model over its best figures; each axis scaled so the best model reaches 1."""
    name = f"radar_{mode}.png"
    ok = data.ok[data.ok["mode"] == mode]
    if ok.empty:
        return PlotOutcome(name, skipped=f"no ok {mode} runs")
    models = [m for m in _model_order(data.runs) if m in set(ok["model"])]
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
                use = rows[[bool(json.loads(c).get("data")) for c in rows["config"]]]
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

    fig = _figure(10, 8)
    # Fixed axes box (no tight_layout): the spoke labels sit outside the circle and need the margin.
    ax = fig.add_axes((0.22, 0.2, 0.56, 0.6), projection="polar")
    angles = [2 * math.pi * i / len(axes) for i in range(len(axes))]
    for i, m in enumerate(models):
        color = _SERIES_COLORS[i % len(_SERIES_COLORS)]
        ring = scores[m] + scores[m][:1]
        ax.plot(angles + angles[:1], ring, color=color, lw=1.8, marker="o", label=m)
        ax.fill(angles + angles[:1], ring, color=color, alpha=0.12)
    tops = []
    for i, a in enumerate(axes):
        pairs = [(x, m) for m, v in best.items() if (x := v[i]) is not None and x > 0]
        pick = (max(pairs) if a.higher_is_better else min(pairs)) if pairs else None
        tops.append(f"best: {_value_text(pick[0], a.unit)} ({pick[1]})" if pick else "no figures")
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
    return PlotOutcome(name, _save(fig, out / name, foot, layout=False))


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
    fig = _figure(12.5, 7)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs, ys = list(pts["intensity"]), list(pts["achieved"])
    xmin, xmax = min(xs) / 3, max(xs) * 3
    for (_, flops_peak, bw) in ceilings:
        xmin, xmax = min(xmin, flops_peak / bw / 4), max(xmax, flops_peak / bw * 4)
    styles = ("-", "--", ":", "-.")
    for i, (label, flops_peak, bw) in enumerate(ceilings):
        ridge = flops_peak / bw
        ls = styles[i % len(styles)]
        ax.plot([xmin, ridge, xmax], [xmin * bw, flops_peak, flops_peak], color="black", lw=1.6, ls=ls,
                label=f"roof {label}: {_si(flops_peak, 'FLOP/s')}, {_si(bw, 'B/s')}")
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
    return PlotOutcome(name, _save(fig, out / name, foot))


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


def _value_text(x: float, unit: str) -> str:
    from lmprof.show.format import number

    return number(x, unit)


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


# -- all of them ----------------------------------------------------------------------------------
@literal_text
def make_plots(folder: str | Path, out: str | Path | None = None) -> list[PlotOutcome]:
    """Write every plot that applies to the sweep in ``folder`` into ``out`` (default ``<folder>/plots``)."""
    data = load_sweep(folder)
    dest = Path(out) if out is not None else Path(folder) / "plots"
    if data.ok.empty:
        return [PlotOutcome("*", skipped="the sweep has no ok runs yet")]
    modes = [m for m in PHASES if m in set(data.ok["mode"])]
    results: list[PlotOutcome] = []
    for mode in modes:
        results.append(plot_blocks(data, mode, dest))
        results.append(plot_blocks(data, mode, dest, share=True))
    for mode in modes:
        results.append(plot_subblocks(data, mode, "attn", dest))
        results.append(plot_subblocks(data, mode, "mlp", dest))
    tp = {m: THROUGHPUT[m][0] for m in modes}
    tp_labels = {m: THROUGHPUT[m][1] for m in modes}
    results.append(plot_metric_vs(data, "batch_size", tp, tp_labels, "Throughput vs batch size, per model",
                                  "throughput_vs_batch.png", dest))
    results.append(plot_metric_vs(data, "seq_len", tp, tp_labels, "Throughput vs sequence length, per model",
                                  "throughput_vs_seq_len.png", dest))
    results.append(plot_energy(data, "per_token", dest))
    results.append(plot_energy(data, "flop_per_joule", dest))
    results.append(plot_mfu(data, dest))
    for mode in modes:
        results.append(plot_radar(data, mode, dest))
    results.append(plot_roofline(data, dest))
    return results
