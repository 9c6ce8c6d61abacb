"""What every sweep plot shares: the sweep's frames, the figure and its footer, colours, axes.

The plots themselves are in ``show/sweep_plots.py`` (per-block time, sub-blocks, a metric against an
axis, energy, MFU; and :func:`~lmprof.show.sweep_plots.make_plots`, which writes them all) and
``show/sweep_compare.py`` (the radar of models, the roofline of every run's blocks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lmprof.atomic import atomic_path
from lmprof.modes import MODES
from lmprof.names import FORWARD_BLOCKS, IDLE, PHASE_ROWS
from lmprof.record.catalogue import throughput

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The product's axes that tell configurations apart (repeats of one configuration are aggregated).
CONFIG_AXES = ("mode", "model", "dev", "dtype", "compile", "attention", "batch_size", "seq_len")
PER = {"train": "ms per training step", "infer": "ms per generation"}
# The catalogue's throughput figure per mode: (column, axis label).
THROUGHPUT: dict[str, tuple[str, str]] = {mode: (throughput(mode).name, f"{mode}: {throughput(mode).label} ({throughput(mode).unit})")
              for mode in MODES}
BLOCK_ORDER = (*FORWARD_BLOCKS, *PHASE_ROWS, IDLE)
FIXED_COLORS = {
    "embedding": "#8c6bb1", "ln_1": "#a1d99b", "attn.qkv": "#fdae6b", "attn.scores": "#fd8d3c",
    "attn.softmax": "#e6550d", "attn.av": "#a63603", "attn.sdpa": "#cb181d", "attn.proj": "#fdd0a2",
    "residual": "#bdbdbd", "ln_2": "#74c476", "moe.router": "#fee391", "moe.experts": "#41b6c4", "mlp.fc": "#6baed6", "mlp.act": "#2171b5", "mlp.proj": "#08306b",
    "ln_f": "#31a354", "lm_head": "#807dba", "loss": "#54278f", "accumulate_grad": "#969696",
    "model_glue": "#c7e9c0", "autograd_engine": "#bcbddc", "other": "#d9d9d9", "idle": "#f0f0f0",
}
EXTRA_COLORS = ("#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1b9e77", "#7570b3", "#d95f02", "#666666")
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
AXIS_NAME = {"dev": "device", "batch_size": "batch size", "seq_len": "sequence length"}
AXIS_TEXT = {"batch_size": "batch size (sequences)", "seq_len": "sequence length (tokens; infer: prompt tokens)"}


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
def new_figure(width: float, height: float) -> "Figure":
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


def save_figure(fig: "Figure", path: Path, footer: Sequence[str] = (), legend: SideLegend | None = None,
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


def legend_handles(axes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ax in getattr(axes, "flat", axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            out.setdefault(label, h)
    return out


def repeats_text(data: "SweepData") -> str:
    n = int(data.ok["repeat"].max()) + 1 if not data.ok.empty else 1
    return f"median of {n} repeats" if n > 1 else "one run per configuration"


def varying(df: "pd.DataFrame", axes: Sequence[str]) -> list[str]:
    return [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]


def axis_text(axis: str, value: Any) -> str:
    if axis == "batch_size":
        return f"b{value}"
    if axis == "seq_len":
        return f"t{value}"
    if axis == "compile":
        return "compiled" if value else "eager"
    return str(value)


def natural_key(text: str) -> list[Any]:
    """Sort 'b2 t64' before 'b16 t32': digit runs compare as numbers."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def config_label(row: Any, axes: Sequence[str]) -> str:
    return " ".join(axis_text(a, row[a]) for a in axes) or "all runs"


def median_by_config(df: "pd.DataFrame", values: Sequence[str]) -> "pd.DataFrame":
    """One row per configuration: the median of its repeats, NaN (n/a) values ignored."""
    keys = [a for a in CONFIG_AXES if a in df.columns]
    groups = df.groupby(keys, dropna=False, sort=False)
    out = groups[list(values)].median()
    # a configuration is marked noisy when any of its repeats was
    out["any_noisy"] = groups["noisy"].max().fillna(0) > 0 if "noisy" in df.columns else False
    table: pd.DataFrame = out.reset_index()  # the group keys back as columns
    return table


def model_order(runs: "pd.DataFrame") -> list[str]:
    """Models from smallest to largest by parameter count (unknown sizes last), then by name."""
    sizes = runs.groupby("model")["params"].max() if "params" in runs.columns else None

    def key(m: str) -> tuple[float, str]:
        size = sizes.get(m) if sizes is not None else None
        return (float(size) if size is not None and not math.isnan(size) else math.inf, str(m))

    return sorted(runs["model"].unique(), key=key)


def block_colors(names: Sequence[str]) -> dict[str, str]:
    colors, extra = {}, iter(EXTRA_COLORS * 8)
    for n in names:
        colors[n] = FIXED_COLORS.get(n) or next(extra)
    return colors


def block_sorted(names: Sequence[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(BLOCK_ORDER)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def pick_column(df: "pd.DataFrame", candidates: Sequence[str]) -> str | None:
    """The first candidate column that has at least one value."""
    for c in candidates:
        if c in df.columns and df[c].notna().any():
            return c
    return None


def na_reason(data: SweepData, prefix: str, what: str) -> str:
    notes = data.notes(prefix)
    if notes:
        top = sorted(notes.items(), key=lambda kv: -kv[1])
        text = "; ".join(f"{n} ({c} runs)" for n, c in top[:2])
        return f"no {what} measured: {text}"
    return f"no {what} in any ok run (no run has {prefix}* metrics)"


def log2_axis(ax: "Axes", values: Sequence[float]) -> None:
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


def value_text(x: float, unit: str) -> str:
    from lmprof.show.format import number

    return number(x, unit)


def short_si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def energy_columns(ok: "pd.DataFrame", mode: str, kind: str) -> tuple[str | None, bool]:
    """The energy column for a mode: measured first, then estimated; (column, estimated?)."""
    if kind == "per_token":
        measured = ["energy_per_token_j", "energy_per_generated_token_j"]
        estimated = ["energy_estimated_per_token_j", "energy_estimated_per_generated_token_j"]
    else:
        measured = ["energy_flop_per_joule", "energy_flops_per_joule"]
        estimated = ["energy_estimated_flop_per_joule", "energy_estimated_flops_per_joule"]
    sub = ok[ok["mode"] == mode]
    col = pick_column(sub, measured)
    if col:
        return col, False
    col = pick_column(sub, estimated)
    return col, col is not None
