"""The measurement protocol shared by every entry point (train, infer, the user's own loop).

Warm-up, then a clean window (device synced around each step, no profiler, energy metered over
exactly those steps), then a profiled window whose trace is attributed per block, then the run
record: blocks reconciled to the clean step, the overhead metric, the folder it is saved in.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Callable

from lmprof.hardware.devices import Device, environment
from lmprof.measure.energy import EnergyMonitor, energy_metrics
from lmprof.measure.timing import time_calls
from lmprof.record.run import Block, Env, Metric, Run
from lmprof.trace.attribution import Attribution

NOISY_PROFILE = ("the profiled phase ran faster than the clean one: run-to-run noise is larger than the "
                 "profiler's overhead here (a busy machine?); compare spreads before trusting small differences")


def measured_window(
    fn: Callable[[], object], steps: int, sync: Callable[[], None], monitor: EnergyMonitor
) -> tuple[list[float], Any]:
    """Time ``steps`` calls of ``fn`` with the energy window around exactly those calls.

    When a meter needs a longer window than ``steps`` give, more steps are timed (never fewer).
    Returns the per-call seconds and the EnergyResult (None when energy is off).
    """
    if monitor.mode == "off":
        return time_calls(fn, steps, sync), None
    if monitor.available:
        probe = time_calls(fn, 1, sync)[0]  # one step's length decides how many reach the window
        steps += monitor.extra_steps(step_s=probe, steps=steps)
    sync()
    monitor.begin()
    samples = time_calls(fn, steps, sync)
    result = monitor.end()
    monitor.close()
    return samples, result


def blocks_from(att: Attribution, clean_step_ms: float) -> list[Block]:
    """Attribution parts as Block rows, scaled so they add up to the clean step time."""
    total = att.total_us() or 1.0
    scale = clean_step_ms / (total / 1e3)
    rows = []
    for p in sorted(att.parts, key=lambda p: (p.phase, -p.us)):
        ms = p.us / 1e3
        rows.append(
            Block(name=p.name, phase=p.phase, time_ms=ms * scale, profiled_ms=ms, pct=100.0 * p.us / total, calls=round(p.calls))
        )
    return rows


def run_folder(out: str | Path, mode: str, label: str, device: Device) -> Path:
    """A new folder name under ``out``: time stamp, mode, label and device kind, never reused."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{stamp}-{mode}-{label}-{device.kind}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def overhead_metrics(att: Attribution, clean_ms: float, what: str, notes: list[str]) -> dict[str, Metric]:
    """The profiled step (or generation) and the profiler's overhead against the clean one."""
    profiled = att.mean_step_us / 1e3
    key = "profiled_step_time" if what == "step" else "profiled_e2e_latency"
    metrics = {key: Metric.from_samples([s / 1e3 for s in att.step_us], "ms", "measured")}
    metrics["profiler_overhead"] = Metric(
        value=100.0 * (profiled - clean_ms) / clean_ms if clean_ms else None,
        unit="%",
        source="derived",
        note=(f"profiled {what} time vs clean {what} time; block times are scaled to the clean {what}"
              if what == "step" else "profiled vs clean generation; block times are scaled to the clean generation"),
    )
    if profiled < clean_ms:
        notes.append(NOISY_PROFILE)
    return metrics


def add_energy(run: Run, energy: Any, **totals: Any) -> None:
    """Energy figures over the measured window (totals: steps, tokens, FLOPs in that window)."""
    run.metrics.update(energy_metrics(energy, **totals))
    run.notes.extend([energy.explanation(), *energy.warnings])


def assemble_run(
    mode: str, device: Device, out_dir: Path, config: dict[str, Any], metrics: dict[str, Metric],
    att: Attribution, clean_ms: float, prof: Any, notes: list[str], energy: Any,
) -> Run:
    """The Run record common to train and infer: env, blocks scaled to the clean time, ops, tables."""
    run = Run(
        id=out_dir.name,
        mode=mode,  # type: ignore[arg-type]
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        env=Env(**environment(device)),
        config=config,
        metrics=metrics,
        blocks=blocks_from(att, clean_ms),
        ops=prof.ops,
        notes=[*notes, *att.notes],
        files={"trace": "trace.json.gz"},
    )
    if energy is not None:
        run.tables["energy"] = energy.rows()
    run.tables["attribution"] = [
        {"clock": att.clock, "profiled_steps": att.steps, "profiled_step_ms": [s / 1e3 for s in att.step_us]}
    ]
    return run
