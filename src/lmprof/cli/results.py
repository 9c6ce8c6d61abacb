"""``lmprof results SWEEP_DIR``: the sweep's runs as a table, or exported to CSV / Parquet."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import console
from lmprof.record.catalogue import ranked

# (column, header, unit) shown in the terminal table when the sweep has them: the catalogue's figures
# with a results header, in the view's order.
_FIGURES = tuple((m.column, m.results_header, m.unit) for m in ranked("view") if m.results_header)
# (column, header) of the configuration axes; only those that vary in the sweep are shown.
_AXES = (("mode", "mode"), ("model", "model"), ("batch_size", "b"), ("seq_len", "t"), ("dev", "device"),
         ("dtype", "dtype"), ("attention", "attn"), ("compile", "compile"))
_STYLE = {"ok": "green", "oom": "magenta", "timeout": "yellow", "error": "red", "pending": "dim", "running": "cyan"}


def _cell(value: Any, unit: str) -> str:
    from lmprof.show.format import number

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = number(float(value), unit)
    return text.rsplit(" ", 1)[0] if unit in ("ms", "tokens/s", "%", "J/token") else text


@app.command()
def results(
    sweep_dir: Path = typer.Argument(..., help="A sweep folder (or its results.sqlite)"),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Write every run (all columns) to this CSV file"),
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="Write every run (all columns) to a Parquet file"),
) -> None:
    """List a sweep's runs with their status and main figures; --csv/--parquet export all columns."""
    from rich import box
    from rich.table import Table

    from lmprof.errors import DataError
    from lmprof.atomic import atomic_path
    from rich.text import Text

    from lmprof.outdir import check_not_input, check_output_file
    from lmprof.record.store import db_path, load_results

    for flag, dest in (("--csv", csv), ("--parquet", parquet)):
        if dest is not None:  # before reading: the store must survive a destination typed onto it
            check_not_input(dest, [sweep_dir, db_path(sweep_dir)], flag)
    df = load_results(sweep_dir)
    if csv or parquet:
        if csv:
            check_output_file(csv, "--csv")
            with atomic_path(csv) as tmp:
                df.to_csv(tmp, index=False)
            console.print(f"wrote {csv} ({len(df)} runs, {len(df.columns)} columns)")
        if parquet:
            try:
                check_output_file(parquet, "--parquet")
                with atomic_path(parquet) as tmp:
                    df.to_parquet(tmp, index=False)
            except ImportError:
                raise DataError("writing Parquet needs pyarrow: pip install 'lmprof[parquet]'") from None
            console.print(f"wrote {parquet} ({len(df)} runs, {len(df.columns)} columns)")
        return
    df["dev"] = df["device_resolved"].where(df["device_resolved"].notna(), df["device"])
    figures = [f for f in _FIGURES if f[0] in df.columns and df[f[0]].notna().any()]
    axes = [(c, h) for c, h in _AXES if df[c].nunique(dropna=False) > 1] or [("model", "model")]
    # The run's own verdict on its timing (run.json "noisy"): its figures are not to be compared as they are.
    noisy = "noisy" in df.columns and bool(df["noisy"].notna().any())
    failed = bool((df["status"] != "ok").any())
    table = Table(title=f"Sweep {sweep_dir}: {len(df)} points", title_justify="left", box=box.SIMPLE_HEAD,
                  collapse_padding=True, pad_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    if noisy:
        table.add_column("noisy", no_wrap=True)
    for col, header in axes:
        table.add_column(header, justify="right" if col in ("batch_size", "seq_len") else "left", no_wrap=True,
                         min_width=max(len(header), 4))
    for _, header, _unit in figures:
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    for _, r in df.iterrows():
        style = _STYLE.get(r["status"], "white")
        cells = [str(r[c]) if c != "compile" else ("yes" if r[c] else "no") for c, _ in axes]
        mark = [("NOISY" if r["noisy"] == 1 else "")] if noisy else []
        row = [r["id"], Text(str(r["status"]), style=style), *mark, *cells,
               *[_cell(r[col], unit) for col, _, unit in figures]]
        table.add_row(*row)
    console.print(table)
    fixed = [f"{h} {df[c].iloc[0] if c != 'compile' else ('yes' if df[c].iloc[0] else 'no')}"
             for c, h in _AXES if (c, h) not in axes]
    if fixed:
        console.print("same for every point: " + ", ".join(fixed))
    if failed:  # reasons below the table: they are long, the table stays readable
        for _, r in df[df["status"] != "ok"].iterrows():
            style = _STYLE.get(r["status"], "white")
            console.print(Text.assemble((str(r["status"]), style), f" {r['id']} {r['label']}: {r['message'] or ''}"),
                          soft_wrap=True)
    counts = df["status"].value_counts()
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if noisy and (df["noisy"] == 1).any():
        console.print(f"{int((df['noisy'] == 1).sum())} NOISY: timed while the machine was busy; their figures "
                      "are not comparable with the others as they are")
