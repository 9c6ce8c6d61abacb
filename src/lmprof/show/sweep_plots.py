"""PNG plots of a finished sweep, from its ``results.sqlite`` (see docs/sweeps.md, "Plots").

Every plot uses ``ok`` runs only: a failed point (oom, timeout, error) has no figures, and it is left
out and counted in the plot's footer, never drawn as zero or infinity. Figures that no run measured
(``n/a``) are left out the same way. A plot that cannot be drawn from what the sweep measured is
skipped with the reason, which the caller prints.

Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch). What the plots share is
in ``show/sweep_canvas.py``; the radar and the roofline, which compare models, in ``show/sweep_compare.py``.
"""
from __future__ import annotations

from pathlib import Path

from lmprof.modes import MODES, traits
from lmprof.show.literal import literal_text
from lmprof.show.sweep_canvas import (
    AXIS_NAME,
    AXIS_TEXT,
    CONFIG_AXES,
    PER,
    PlotOutcome as PlotOutcome,
    SERIES_COLORS,
    SERIES_MARKERS,
    SideLegend,
    SweepData as SweepData,
    THROUGHPUT,
    block_colors,
    block_sorted,
    config_label,
    energy_columns,
    legend_handles,
    load_sweep as load_sweep,
    log2_axis,
    median_by_config,
    model_order,
    na_reason,
    natural_key,
    new_figure,
    pick_column,
    repeats_text,
    save_figure,
    varying,
)
from lmprof.show.sweep_compare import plot_radar as plot_radar, plot_roofline as plot_roofline


# -- 1. stacked per-block time per configuration --------------------------------------------------
def plot_blocks(data: SweepData, mode: str, out: Path, share: bool = False) -> PlotOutcome:
    """Stacked horizontal bars: every block's time in each phase, one bar per configuration.

    ``share=True`` draws each bar as percentages of its phase, so configurations of very different
    sizes can be compared by where their time goes.
    """
    name = f"blocks_{'share_' if share else ''}{mode}.png"
    blocks = data.blocks[(data.blocks["mode"] == mode) & data.blocks["phase"].isin(traits(mode).phases)]
    if blocks.empty:
        return PlotOutcome(name, skipped=f"no ok {mode} runs with per-block times")
    keys = [a for a in CONFIG_AXES if a in blocks.columns]
    per_run = blocks.groupby(["point_id", *keys, "phase", "name"], dropna=False, sort=False)["time_ms"].sum()
    table = per_run.groupby([*keys, "phase", "name"], dropna=False, sort=False).median().reset_index()
    configs = table[keys].drop_duplicates().reset_index(drop=True)
    label_axes = varying(configs, keys)
    configs["label"] = [config_label(r, label_axes) for _, r in configs.iterrows()]
    table = table.merge(configs, on=keys)
    names = block_sorted(table["name"])
    colors = block_colors(names)
    labels = list(configs["label"])
    n = len(labels)
    fig = new_figure(13, max(3.4, 0.32 * n + 2.4))
    axes = fig.subplots(1, len(traits(mode).phases), sharey=True, squeeze=False)[0]
    for ax, phase in zip(axes, traits(mode).phases):
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
    what = " and ".join(traits(mode).phases)
    unit = "% of each phase" if share else PER[mode]
    fig.suptitle(f"Per-block time per configuration, {mode}: {what}\n({unit}; {repeats_text(data)})", fontsize=11)
    foot = ["optimizer, data and zero_grad (the step phase) are not shown" if traits(mode).trains else "",
            *data.footer(mode)]
    return PlotOutcome(name, save_figure(fig, out / name, foot, SideLegend(legend_handles(axes), names, "block", 1.9)))


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
    models = [m for m in model_order(data.runs) if m in set(table["model"])]
    devices = sorted(table["dev"].unique(), key=str)
    inner = varying(table[keys].drop_duplicates(), [k for k in keys if k not in ("mode", "model", "dev")])
    names = block_sorted(table["name"])
    colors = block_colors(names)
    n_cfg = max(len(table[table["model"] == m][inner].drop_duplicates()) if inner else 1 for m in models)
    fig = new_figure(max(8.0, 3.0 + len(models) * max(3.4, 0.45 * n_cfg)), 2.4 + 3.4 * len(devices))
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
            labels = [config_label(row, inner) for _, row in cfgs.iterrows()]
            sub = sub.assign(label=[config_label(row, inner) for _, row in sub.iterrows()])
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
    phases = " + ".join(traits(mode).phases)
    fig.suptitle(f"{title} sub-blocks per model and device, {mode}\n({phases}; {PER[mode]}; {repeats_text(data)})",
                 fontsize=10.5)
    legend = SideLegend(legend_handles(grid), names, "sub-block", 1.6)
    return PlotOutcome(name, save_figure(fig, out / name, data.footer(mode), legend))


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
    models = [m for m in model_order(data.runs) if any(m in set(sub["model"]) for _, _, sub in panels)]
    fig = new_figure(max(8.0, 3.2 + 4.2 * len(models)), 1.6 + 3.4 * len(panels))
    grid = fig.subplots(len(panels), len(models), squeeze=False)
    others = [a for a in CONFIG_AXES if a not in ("mode", "model", x)]
    series_axes = varying(ok, others)
    # Colours fixed per series over the whole figure, in sorted order, so every panel agrees.
    meds = [median_by_config(sub, [col]) for _, col, sub in panels]
    labels = sorted({config_label(row, series_axes) for med in meds for _, row in med.iterrows()},
                    key=natural_key)
    styles = {lab: (SERIES_COLORS[i % len(SERIES_COLORS)], SERIES_MARKERS[i % len(SERIES_MARKERS)])
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
                label = config_label(g.iloc[0], series_axes)
                color, marker = styles[label]
                ax.plot(g[x], g[col], marker=marker, color=color, label=label, lw=1.4, ms=5)
                shaky = g[g["any_noisy"]]
                if not shaky.empty:  # a ring around points whose timing was noisy (see the footer)
                    ax.plot(shaky[x], shaky[col], ls="", marker="o", ms=11, mfc="none", mec="#d62728", mew=1.2)
            log2_axis(ax, xs)
            ax.set_xlabel(AXIS_TEXT[x], fontsize=8.5)
            ax.set_ylabel(ylabel_by_mode[mode], fontsize=8.5)
            ax.set_ylim(bottom=0)
            ax.grid(True, lw=0.4, alpha=0.5)
    fig.suptitle(f"{title}\n({repeats_text(data)}; n/a values left out)", fontsize=11)
    legend = (SideLegend(legend_handles(grid), list(styles), ", ".join(AXIS_NAME.get(a, a) for a in series_axes))
              if series_axes else None)
    return PlotOutcome(name, save_figure(fig, out / name, data.footer(), legend))




def plot_energy(data: SweepData, kind: str, out: Path) -> PlotOutcome:
    """Energy per token, or FLOPs per joule, against batch size (only where energy was measured)."""
    name = "energy_per_token_vs_batch.png" if kind == "per_token" else "flop_per_joule_vs_batch.png"
    cols: dict[str, str] = {}
    est: list[bool] = []
    for mode in MODES:
        col, is_est = energy_columns(data.ok, mode, kind)
        if col:
            cols[mode] = col
            est.append(is_est)
    if not cols:
        what = "energy per token" if kind == "per_token" else "FLOPs per joule"
        return PlotOutcome(name, skipped=na_reason(data, "energy.", what))
    source = "estimated" if all(est) else "measured" if not any(est) else "measured or estimated"
    if kind == "per_token":
        ylabels = {m: f"{m}: J per {traits(m).token}" for m in cols}
        title = f"Energy per token vs batch size, per model ({source}; lower is better)"
    else:
        ylabels = {m: f"{m}: FLOP per J" for m in cols}
        title = f"FLOPs per joule vs batch size, per model ({source}; higher is better)"
    return plot_metric_vs(data, "batch_size", cols, ylabels, title, name, out)


def plot_mfu(data: SweepData, out: Path) -> PlotOutcome:
    """MFU (%) against batch size; skipped with the reason when no run has an MFU figure."""
    name = "mfu_vs_batch.png"
    if not pick_column(data.ok, ["mfu_pct"]):
        return PlotOutcome(name, skipped=na_reason(data, "mfu", "MFU"))
    modes: list[str] = [m for m in MODES if m in set(data.ok["mode"])]
    return plot_metric_vs(data, "batch_size", {m: "mfu_pct" for m in modes}, {m: f"{m}: MFU (%)" for m in modes},
                          "Model FLOPs utilisation (MFU) vs batch size, per model", name, out)


# -- all of them ----------------------------------------------------------------------------------
@literal_text
def make_plots(folder: str | Path, out: str | Path | None = None) -> list[PlotOutcome]:
    """Write every plot that applies to the sweep in ``folder`` into ``out`` (default ``<folder>/plots``)."""
    data = load_sweep(folder)
    dest = Path(out) if out is not None else Path(folder) / "plots"
    if data.ok.empty:
        return [PlotOutcome("*", skipped="the sweep has no ok runs yet")]
    modes: list[str] = [m for m in MODES if m in set(data.ok["mode"])]
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
