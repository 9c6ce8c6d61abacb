"""The parts of a Run every entry point shares: blocks reconciled to the clean step, the profiler's
overhead, the noise verdict, the compile report, energy."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmprof.analysis.noise import (block_outliers, input_note, load_note, noise_reasons, profiled_window,
                                   warming_note)
from lmprof.analysis.reconcile import reconcile
from lmprof.hardware.devices import Device, environment
from lmprof.measure.energy import energy_metrics
from lmprof.measure.energy.monitor import EnergyResult
from lmprof.measure.profiling import ProfiledPhase
from lmprof.measure.noise import Snapshot
from lmprof.atomic import write_text
from lmprof.measure.compile_events import CompileReport
from lmprof.measure.profiler_cost import EventCost, event_cost
from lmprof.modes import Mode, traits
from lmprof.record.catalogue import PROFILER_OVERHEAD, pick
from lmprof.record.run import Env, Metric, Run
from lmprof.trace.attribution import Attribution


def overhead_metrics(att: Attribution, clean_ms: float, mode: Mode) -> dict[str, Metric]:
    """The profiled step (or generation) and the profiler's overhead against the clean one."""
    # The median, like the clean figure and the table: one slow profiled step must not set the overhead.
    profiled = float(np.median(att.step_us)) / 1e3 if att.step_us else 0.0
    what = traits(mode).unit
    metrics = {pick("profiled", mode).name: Metric.from_samples([s / 1e3 for s in att.step_us], "ms", "measured")}
    metrics[PROFILER_OVERHEAD] = Metric(
        value=100.0 * (profiled - clean_ms) / clean_ms if clean_ms else None,
        unit="%",
        source="derived",
        note=(f"profiled {what} time vs clean {what} time; block times are scaled to the clean {what}"
              if what == "step" else "profiled vs clean generation; block times are scaled to the clean generation"),
    )
    return metrics


def add_energy(run: Run, energy: EnergyResult, **totals: Any) -> None:
    """Energy figures over the measured window (totals: steps, tokens, FLOPs in that window; the mode),
    and each domain's reading as ``tables["energy"]`` (the report's Meters table)."""
    run.metrics.update(energy_metrics(energy, **totals))
    run.tables["energy"] = energy.rows()
    run.notes.extend([energy.explanation(), *energy.warnings])


def profiler_cost_for(att: Attribution) -> EventCost | None:
    """The per-event profiler cost to take out of a CPU-clock attribution (None on a device clock)."""
    return event_cost() if att.clock == "cpu" else None


def assemble_run(
    mode: Mode, device: Device, out_dir: Path, config: dict[str, Any],
    metrics: dict[str, Metric], att: Attribution, clean_ms: float, prof: ProfiledPhase, notes: list[str],
) -> Run:
    """The Run record common to every entry point: env, blocks reconciled to the clean time, ops, tables."""
    cost = profiler_cost_for(att)
    rec = reconcile(att, clean_ms, cost)
    run = Run(
        id=out_dir.name,
        mode=mode,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        env=Env.model_validate(environment(device)),  # the same validation as Env(**...), facts beyond the fields kept
        config=config,
        metrics=metrics,
        blocks=rec.blocks,
        ops=prof.ops,
        notes=[*notes, *att.notes, *rec.notes],
        files={"trace": "trace.json.gz"},
    )
    run.tables["attribution"] = [{
        "clock": att.clock, "profiled_steps": att.steps, "profiled_step_ms": [s / 1e3 for s in att.step_us],
        "correction": rec.correction, "event_cost_us": cost.to_dict() if cost else None,
        "removed_ms_per_step": rec.removed_us_per_step / 1e3, "lmprof_ms_per_step": rec.own_us_per_step / 1e3,
        "scale_to_clean": rec.scale,
        "outliers": block_outliers(att),
    }]
    if att.fused_kernels:
        run.tables["fused_kernels"] = fused_kernel_rows(att)
    return run


def fused_kernel_rows(att: Attribution) -> list[dict[str, Any]]:
    """run.tables["fused_kernels"]: each fused compiled kernel, its profiled time per step and its split."""
    return [{"kernel": f.kernel, "phase": f.phase, "fused": f.label, "blocks": list(f.blocks),
             "shares": [round(x, 6) for x in f.shares], "basis": f.basis,
             "profiled_ms": f.us / 1e3, "calls": f.calls} for f in att.fused_kernels]


def mark_noise(run: Run, samples_ms: list[float], what: str, before: Snapshot, after: Snapshot,
               device_kind: str, aside: Sequence[int] = (), judge_window: bool = True,
               waits_ms: Sequence[float | None] | None = None) -> None:
    """Mark ``run`` noisy, with the reasons, when its timed window was not steady; first steps still
    warming up and a window too short for the load counters to judge are notes. ``aside``: profiled
    steps (from 0) that also ran an evaluation or saved a checkpoint, whose extra time is known work.
    ``judge_window`` False: the profile is the figures step's, a warm-up step recorded with memory events,
    whose time is a first call's and not the profiled window's to judge against the clean steps.
    ``waits_ms``: each sample's wait for its input (None: not known), so that a loop whose batches arrive
    unevenly is said to be so, not noisy."""
    window = profiled_window(run) if judge_window else None
    if window is not None and aside and len(aside) < len(window.steps_ms):
        left_out = set(aside)
        window = dataclasses.replace(window, steps_ms=[s for i, s in enumerate(window.steps_ms) if i not in left_out])
        listed = ", ".join(str(i + 1) for i in aside)
        run.notes.append(f"profiled {what} {listed} also ran an evaluation or saved a checkpoint: its extra time "
                         "is that work, not noise; the profiled window is judged without it")
    reasons = noise_reasons(samples_ms, what, before, after, device_kind, window, waits_ms)
    run.noisy, run.noise = bool(reasons), reasons
    run.notes.extend(n for n in [warming_note(samples_ms, what), input_note(samples_ms, waits_ms, what),
                                 load_note(before, after, device_kind)] if n)


COMPILED_KERNELS = "compiled_kernels.json"


def add_compile_report(run: Run, report: CompileReport | None, out_dir: Path) -> None:
    """Compilations, recompilations and graph breaks of a compiled run into run.json (tables.compile);
    the compiled graphs' kernels and their blocks into ``compiled_kernels.json``."""
    if report is None:
        return
    run.metrics.update(report.metrics())
    run.tables["compile"] = report.rows()
    run.notes.extend(report.notes())
    if report.kernel_graphs:
        write_text(out_dir / COMPILED_KERNELS, json.dumps({"graphs": report.kernel_graphs}, indent=1))
        run.files["compiled_kernels"] = COMPILED_KERNELS
