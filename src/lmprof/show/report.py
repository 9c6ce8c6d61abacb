"""HTML reports people read: one self-contained file per run, and one per sweep.

A report is a single HTML file that opens offline: the stylesheet and the little script are inline,
plots are embedded as base64 PNG data URIs, and nothing is fetched from the network. The only links
are relative ones to files next to the report (the trace).

Run report sections: headline figures, recommendations, where the step goes (table + chart), top
operators, compute efficiency and roofline, memory, energy, trace analysis, notes, every figure,
environment, configuration, and the trace file. A section whose figures the run did not record says
so ("not recorded in this run", or "n/a: <reason>" when the run says why) instead of disappearing.

Sweep report: every PNG in the sweep's ``plots/``, a sortable table of runs, the best configuration
per objective, and the failed points with their reasons.

This module formats; it computes no figure (recommendations come from :mod:`lmprof.analysis.advice`).
"""
from __future__ import annotations

from pathlib import Path

from lmprof.errors import DataError
from lmprof.record.run import Run
from lmprof.show.html import REPORT_NAME
from lmprof.show.run_report import block_chart_png, render_run_report, report_line, write_run_report
from lmprof.show.sweep_report import best_points, is_sweep_folder, load_sweep_table, render_sweep_report, write_sweep_report
from lmprof.show.trace_findings import TraceFindings, findings_from_analysis, trace_findings

__all__ = ["REPORT_NAME", "TraceFindings", "best_points", "block_chart_png", "findings_from_analysis", "is_sweep_folder",
           "load_sweep_table", "render_run_report", "render_sweep_report", "report_line", "trace_findings", "write_report",
           "write_run_report", "write_sweep_report"]


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a run folder or a sweep folder (detected) and return its path."""
    p = Path(folder)
    if not p.exists():
        raise DataError(f"no such folder: {p}")
    if is_sweep_folder(p):
        return write_sweep_report(p, out)
    if p.is_dir() and not (p / "run.json").is_file():
        raise DataError(f"{p} is neither a run folder (no run.json) nor a sweep folder "
                        "(no results.sqlite, plots/ or run folders inside)")
    return write_run_report(Run.load(p), p.parent if p.is_file() else p, out=out)
