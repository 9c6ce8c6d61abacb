"""``lmprof train``: workload -> clean timing -> profiled phase -> attribution -> run record.

:func:`measure_training` is model-agnostic (the built-in GPT, a Hugging Face model or a user's
module all come in as a :class:`~lmprof.workloads.training.TrainWorkload`); :func:`run_training`
builds the workload from a :class:`~lmprof.config.TrainConfig` and calls it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from lmprof.atomic import write_text
from lmprof.config import MeasureSpec, TrainConfig
from lmprof.errors import ConfigError
from lmprof.hardware.devices import Device, resolve_device
from lmprof.measure.energy import EnergyMonitor
from lmprof.measure.memory import measure_training_memory
from lmprof.measure.profiling import op_table, profile_steps
from lmprof.measure.compile_events import MEASURED
from lmprof.pipeline.budget import check_duration
from lmprof.pipeline.figures import Facts, add_figures
from lmprof.measure.noise import snapshot
from lmprof.pipeline.protocol import (
    add_compile_report,
    incomplete_until_saved,
    watched_warm_up,
    assemble_run,
    mark_noise,
    measured_window,
    overhead_metrics,
    run_folder,
)
from lmprof.record.run import Metric, Run
from lmprof.analysis.block_truth import STOPWATCH_STEPS, mark_uncertain
from lmprof.measure.block_stopwatch import block_stopwatch
from lmprof.trace.attribution import attribute
from lmprof.trace.load import load_trace
from lmprof.workloads.builders import train_workload
from lmprof.workloads.training import TrainStep, TrainWorkload


def measure_training(
    work: TrainWorkload,
    spec: MeasureSpec,
    out_dir: Path,
    config: dict[str, Any],
) -> Run:
    """The measurement protocol for training; writes the trace into ``out_dir`` and returns the Run."""
    torch.manual_seed(spec.seed)
    step = TrainStep(work, spec.dtype)
    sync = work.device.synchronize
    monitor = EnergyMonitor.for_device(work.device, spec.energy, tdp_w=spec.tdp_w, idle_s=spec.idle_s)
    check_duration(step, spec.warmup + spec.steps + spec.profile_steps, sync, force=spec.force)
    monitor.measure_idle()  # before warm-up: a device stays clocked up for a while after work
    watch = watched_warm_up(step, spec.warmup, sync, spec.compile)
    before = snapshot()
    samples, energy = measured_window(step, spec.steps, sync, monitor)
    after = snapshot()
    if watch:
        watch.count(MEASURED, len(samples))
        watch.phase("profiled")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Attribution's check (analysis/block_truth.py): a stopwatch around each block, eager only; a model
    # scoped by module hooks gets its forward blocks timed.
    stopwatch = ({} if spec.compile else
                 block_stopwatch(step, STOPWATCH_STEPS, sync, model=work.model if work.scopes is not None else None))
    memory = measure_training_memory(step, work.model, work.optimizer, work.device, out_dir=out_dir)
    prof = profile_steps(step, work.device.torch_device, out_dir / "trace.json.gz", active=spec.profile_steps, around=work.scopes)
    table = load_trace(prof.trace_path)
    prof.ops = op_table(table, prof.steps)
    att = attribute(table, compiled=watch.kernel_graphs() if watch else ())
    loss = step.last_loss()

    step_ms = [s * 1e3 for s in samples]
    metrics: dict[str, Metric] = {"step_time": Metric.from_samples(step_ms, "ms", "measured")}
    clean = metrics["step_time"].value or 0.0
    metrics.update(overhead_metrics(att, clean, "step"))
    if work.tokens_per_step:
        tps = [work.tokens_per_step / s for s in samples]
        metrics["tokens_per_s"] = Metric.from_samples(tps, "tokens/s", "derived")
        metrics["tokens_per_step"] = Metric(value=work.tokens_per_step, unit="tokens", source="derived",
                                             note="batch x sequence length")
    metrics["params"] = Metric(value=sum(p.numel() for p in work.model.parameters()), unit="count", source="measured")
    if loss is not None:
        metrics["loss"] = Metric(value=loss, unit="nats/token", source="measured", note="last profiled step")
    run = assemble_run("train", work.device, out_dir, config, metrics, att, clean, prof, work.notes, energy)
    mark_noise(run, step_ms, "step", before, after, work.device.kind)
    run.blocks = mark_uncertain(run.blocks, stopwatch)
    add_compile_report(run, watch, out_dir)
    title = f"{config.get('preset') or config.get('model_name', 'model')}, batch {work.batch_size}, seq {work.seq_len}, {spec.dtype}, {work.device}"
    add_figures(run, out_dir, Facts(
        title=title, dtype=spec.dtype, shape=work.shape, batch=work.batch_size, seq_len=work.seq_len,
        attention=work.attention, optimizer=work.optimizer_name, dropout=work.dropout, memory=memory,
        energy=energy, energy_steps=len(samples), tokens_per_step=work.tokens_per_step, plots=spec.plots))
    return run


def run_training(cfg: TrainConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile the built-in GPT's training step; returns the Run and the folder it was saved in.

    Under torchrun (WORLD_SIZE > 1) every rank profiles itself into ``<run>/rank<r>`` and rank 0
    assembles ``<run>/run.json``; with ``cfg.nproc > 1`` outside torchrun, this launches torchrun.
    """
    from lmprof.pipeline import distributed as dist

    if cfg.nproc > 1 and not dist.is_distributed():
        device = resolve_device(cfg.device)  # fail here, in one line, before starting ranks
        folder = out_dir or run_folder(cfg.out, "train", f"{cfg.label()}-ddp{cfg.nproc}", device, batch=cfg.batch_size)
        folder.mkdir(parents=True, exist_ok=True)
        spec = folder / "config.yaml"
        write_text(spec, yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        return dist.launch(["--config", str(spec)], cfg.nproc, folder), folder
    if dist.is_distributed():
        return dist.run_rank(cfg, out_dir, measure_training)
    device = resolve_device(cfg.device)
    if cfg.dtype == "fp16" and device.kind == "cpu":
        raise ConfigError("fp16 training is not supported on CPU here: use bf16 or fp32")
    work, described = train_workload(cfg, device)
    folder = out_dir or run_folder(cfg.out, "train", cfg.label(), device, batch=cfg.batch_size)
    with incomplete_until_saved(folder):
        run = measure_training(work, cfg, folder, run_config(cfg, described, work, device))
        run.save(folder)
    return run, folder


def run_config(cfg: TrainConfig, described: dict[str, Any], work: TrainWorkload, device: Device) -> dict[str, Any]:
    """The config recorded in run.json: the validated options plus what the model turned out to be."""
    config = cfg.model_dump()
    config.update(described, seq_len=work.seq_len, device_resolved=str(device))
    return config
