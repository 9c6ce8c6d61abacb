"""The sweep report: every plot, a sortable table of runs, the best configuration per objective, failures."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from lmprof.errors import DataError
from lmprof.atomic import write_text
from lmprof.outdir import check_output_file
from lmprof.record.catalogue import best_criteria
from lmprof.record.run import Run
from lmprof.record.store import DB_NAME, FAILED, STATUSES, load_results, metric_column
from lmprof.show.format import number
from lmprof.show.html import (
    REPORT_NAME, Absent, Cell, CellLike, Embedder, Para, Section, Table, cell_value, file_inside, local_href, page, table,
)


@dataclass(frozen=True)
class Objective:
    """A 'best configuration' criterion over a sweep's result columns (first matching column wins)."""

    title: str
    columns: tuple[str, ...]
    maximize: bool
    unit: str


# From the metric catalogue, columns named as the sweep store writes them (record.catalogue.metric_column).
OBJECTIVES = tuple(
    Objective(title, tuple(metric_column(m.name, m.unit) for m in specs), bool(specs[0].higher_is_better),
              specs[0].unit)
    for title, specs in best_criteria()
)
# The store's own schema (record/store.py): one name each, nothing guessed.
_STATUS_COLS = ("status",)
_OK = {"ok"}
_UNFINISHED = {s for s in STATUSES if s not in FAILED and s != "ok"}
_REASON_COLS = ("message",)
_ID_COLS = ("label",)
_CONFIG_HINTS = ("mode", "model", "preset", "batch_size", "seq_len", "dtype", "attention", "compile", "device",
                 "n_layer", "n_head", "n_embd", "optimizer", "kv_cache", "new_tokens", "prompt_len", "hf", "repeat")
_HIDDEN_COLUMNS = ("config", "seq")  # the point as JSON: every field already has its own column
_LINK_COLUMNS = ("run_dir",)
_MAX_COLUMNS = 40


def is_sweep_folder(folder: str | Path) -> bool:
    """A sweep folder: has results.sqlite or plots/, or holds run folders but no run.json itself."""
    p = Path(folder)
    if (p / "run.json").is_file():
        return False
    return (p / "results.sqlite").exists() or (p / "plots").is_dir() or any(p.glob("*/run.json"))


def load_sweep_table(folder: str | Path) -> tuple[Any, str]:
    """(DataFrame of sweep points or None, where it came from).

    The store when there is one (:func:`lmprof.record.store.load_results`, whose errors are the
    user's to see); without a store, rows built from the run folders inside, in the store's columns.
    """
    import pandas as pd

    p = Path(folder)
    db = p / DB_NAME
    if db.exists() and not db.is_file():
        raise DataError(f"{db} is a directory, not an lmprof sweep store")
    if db.is_file():
        return load_results(p), DB_NAME
    rows = []
    for rj in sorted(p.glob("*/run.json")):
        try:
            run = Run.load(rj)
        except DataError as exc:
            rows.append({"label": rj.parent.name, "status": "error", "message": str(exc)})
            continue
        row: dict[str, Any] = {"label": run.id, "status": "ok", "mode": run.mode, "run_dir": str(rj.parent)}
        row.update({k: v for k, v in run.config.items() if k in _CONFIG_HINTS})
        row.update({metric_column(k, m.unit): m.value for k, m in run.metrics.items()})
        rows.append(row)
    df = pd.DataFrame(rows) if rows else None
    if df is not None:
        df.attrs["units"] = {}
    return df, "run folders"


def _col(df: Any, names: Sequence[str]) -> str | None:
    lower: dict[str, str] = {str(c).lower(): c for c in df.columns}  # a sweep table's columns are named by strings
    for n in names:
        if n in lower:
            return lower[n]
    return None


def _status(df: Any) -> Any:
    col = _col(df, _STATUS_COLS)
    return None if col is None else df[col].astype(str).str.lower()


def _ok_mask(df: Any) -> Any:
    import pandas as pd

    st = _status(df)
    if st is not None:
        return st.isin(_OK)
    reason = _col(df, _REASON_COLS)
    if reason is not None:
        return df[reason].isna() | (df[reason].astype(str).str.strip() == "")
    return pd.Series(True, index=df.index)


def _failed_mask(df: Any) -> Any:
    st = _status(df)
    if st is None:
        return ~_ok_mask(df)
    return ~st.isin(_OK) & ~st.isin(_UNFINISHED)


def _point_label(df: Any, i: Any) -> str:
    row = df.loc[i]
    ident = _col(df, _ID_COLS)
    who = str(row[ident]) if ident is not None else f"row {i}"
    if ident is not None and str(ident).lower() == "label":
        return who  # the store's label already names the point's axes
    cfg = ", ".join(f"{c}={row[c]}" for c in df.columns if str(c).lower() in _CONFIG_HINTS and not _isna(row[c]))
    return who + (f" ({cfg})" if cfg else "")


def best_points(df: Any) -> list[tuple[Objective, str, float, str, str]]:
    """(objective, column, best value, point label, mode) for every objective with values.

    Training and inference points are never ranked together: with a ``mode`` column, each mode gets
    its own best per objective, from the first of the objective's columns that has values there.
    """
    import pandas as pd

    ok = df[_ok_mask(df)]
    mode_col = _col(ok, ("mode",))
    groups = [(str(m), g) for m, g in ok.groupby(mode_col, sort=False)] if mode_col is not None else [("", ok)]
    out = []
    for mode, group in groups:
        for obj in OBJECTIVES:
            for name in obj.columns:
                col = _col(group, (name,))
                values = pd.to_numeric(group[col], errors="coerce").dropna() if col is not None else None
                if values is None or values.empty:
                    continue
                i = values.idxmax() if obj.maximize else values.idxmin()
                out.append((obj, str(col), float(values[i]), _point_label(group, i), mode))
                break
    return out


def _display_columns(df: Any) -> list[str]:
    """Point name and status, then the objectives' figures, the axes, other figures, the rest."""
    import pandas as pd

    cols = [c for c in df.columns if str(c).lower() not in _HIDDEN_COLUMNS]
    first = [c for c in (_col(df, _ID_COLS), _col(df, _STATUS_COLS)) if c is not None]
    goals = [c for o in OBJECTIVES for c in [_col(df, o.columns)] if c is not None and c not in first]
    axes = [c for c in cols if str(c).lower() in _CONFIG_HINTS and c not in first + goals]
    units = df.attrs.get("units", {}) or {}
    figures = [c for c in cols if c in units and c not in first + goals + axes]
    taken = set(first + goals + axes + figures)
    rest = [c for c in cols if c not in taken]
    # Other numeric columns (durations, attempts) before text (ids, paths, timestamps, messages).
    rest.sort(key=lambda c: not pd.api.types.is_numeric_dtype(df[c]))
    return list(dict.fromkeys(first + goals + axes + figures + rest))[:_MAX_COLUMNS]


def sweep_table_parts(df: Any, sweep_dir: Path) -> list[Any]:
    """All points in a click-to-sort table (numbers sort numerically by their raw value in data-sort)."""
    import pandas as pd

    units: Mapping[str, str] = df.attrs.get("units", {}) or {}
    cols = _display_columns(df)
    numeric = {c for c in cols if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])}
    rows = []
    for _, r in df.iterrows():
        cells: list[CellLike] = []
        for c in cols:
            v = None if _isna(r[c]) else r[c]
            if c in numeric:
                raw = "" if v is None else repr(float(v))
                shown = cell_value(v, units.get(c)) if units.get(c) not in (None, "count") else cell_value(v)
                cells.append(Cell(shown, sort=raw))
            elif str(c).lower() in _LINK_COLUMNS and v:
                cells.append(_folder_link(Path(str(v)), sweep_dir))
            else:
                cells.append(cell_value(v))
        rows.append(cells)
    shown_cols = len([c for c in df.columns if str(c).lower() not in _HIDDEN_COLUMNS])
    note = ([Para(f"First {_MAX_COLUMNS} of {shown_cols} columns shown.", intro=True)]
            if shown_cols > _MAX_COLUMNS else [])
    return [*note, table([str(c) for c in cols], rows, num=(i for i, c in enumerate(cols) if c in numeric),
                         cls="sortable runs", sortable=True)]


def _folder_link(path: Path, base: Path) -> Cell:
    """A relative link to a run folder inside the sweep (its report.html when it has one); anything the
    store names outside the sweep folder is shown as text, never linked."""
    name = str(path)
    if path.is_absolute():
        try:
            name = path.resolve().relative_to(base.resolve()).as_posix()
        except (OSError, ValueError):
            return Cell(path.name)
    target = file_inside(base, name)
    if target is None:
        return Cell(path.name)
    if (target / REPORT_NAME).is_file():
        target = target / REPORT_NAME
    return Cell(path.name, "link", href=local_href(target, base))


def _isna(v: Any) -> bool:
    try:
        return bool(v is None or (isinstance(v, float) and math.isnan(v)))
    except TypeError:
        return False


def render_sweep_report(folder: str | Path) -> str:
    """The sweep report as an HTML string."""
    p = Path(folder)
    df, source = load_sweep_table(p)
    plots = sorted((p / "plots").glob("*.png")) if (p / "plots").is_dir() else []
    embed = Embedder()  # bounded: a sweep folder may come from anyone
    plot_parts: list[Any] = [f for f in (embed.png(f, f.name) for f in plots) if f is not None]
    if not plot_parts:
        plot_parts = [Absent("no plots/*.png in this sweep (make them with `lmprof plots`)")]
    counts = ""
    best: list[Any]
    failed_part: list[Any]
    if df is None or len(df) == 0:
        runs: list[Any] = [Absent("no sweep results found (results.sqlite or run folders)")]
        best = failed_part = [Absent("no results")]
    else:
        runs = sweep_table_parts(df, p)
        bests = best_points(df)
        best = [table(
            ["objective", "mode", "best value", "configuration", "column"],
            [[o.title, mode, number(v, o.unit), label, Cell(col, "code")] for o, col, v, label, mode in bests],
            num=(2,), cls="best",
        ) if bests else Absent("none of the objectives (tokens/s, step time, TTFT, TPOT, MFU, peak memory, "
                               "energy per token) is recorded for a successful point of this sweep")]
        failed = df[_failed_mask(df)]
        reason_col, status_col = _col(df, _REASON_COLS), _col(df, _STATUS_COLS)
        failed_part = [_failed_table(df, failed, reason_col, status_col) if len(failed) else Absent("no failed points")]
        n_ok = int(_ok_mask(df).sum())
        unfinished = len(df) - n_ok - len(failed)
        counts = (f"{len(df)} points: {n_ok} succeeded, {len(failed)} failed"
                  + (f", {unfinished} not finished" if unfinished else "") + "; ")
    sections = [
        Section("best", "Best configuration per objective", best, "Among the points that succeeded."),
        Section("failed", "Failed points", failed_part),
        Section("runs", "All points", runs, "Click a column header to sort; click again to reverse."),
        Section("plots", "Plots", plot_parts, f"{len(plots)} plot(s) from the sweep's plots/ folder." if plots else None),
    ]
    name = p.resolve().name
    return page("sweep_report.html.j2", title=f"lmprof sweep — {name}", sections=sections, script=True, name=name,
                counts=counts, source=source)


def _failed_table(df: Any, failed: Any, reason_col: str | None, status_col: str | None) -> Table:
    return table(
        ["point", "status", "reason"],
        [[_point_label(df, i), str(failed.loc[i, status_col]) if status_col else "failed",
          str(failed.loc[i, reason_col]) if reason_col and not _isna(failed.loc[i, reason_col])
          else "no reason recorded"] for i in failed.index], cls="failed",
    )


def write_sweep_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the sweep report to ``out`` or ``folder/report.html``."""
    path = Path(out) if out is not None else Path(folder) / REPORT_NAME
    check_output_file(path)
    write_text(path, render_sweep_report(folder))
    return path


