"""``lmprof train``: a door that steps a training workload through the one measurement session, as its
own loop (pipeline/protocol/own_loop.py).

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
from lmprof.pipeline.budget import check_duration
from lmprof.pipeline.protocol.folder import incomplete_until_saved, run_folder
from lmprof.pipeline.protocol.observed import Known
from lmprof.pipeline.protocol.own_loop import close, drive_steps, own_session, the_models_own_failures
from lmprof.record.catalogue import LOSS
from lmprof.record.run import Metric, Run
from lmprof.analysis.block_truth import STOPWATCH_STEPS
from lmprof.measure.block_stopwatch import block_stopwatch
from lmprof.workloads.blocks import model_scopes_kept
from lmprof.workloads.builders import train_workload
from lmprof.workloads.training import TrainStep, TrainWorkload


def measure_training(
    work: TrainWorkload,
    spec: MeasureSpec,
    out_dir: Path,
    config: dict[str, Any],
) -> Run:
    """Profile a training workload through the one session; writes the trace into ``out_dir``, returns the Run."""
    torch.manual_seed(spec.seed)
    step = TrainStep(work, spec.dtype)
    sync = work.device.synchronize
    check_duration(step, spec.warmup + spec.steps + spec.profile_steps, sync, force=spec.force)
    name = config.get("preset") or config.get("model_name", "model")
    known = Known(
        title=f"{name}, batch {work.batch_size}, seq {work.seq_len}, {spec.dtype}, {work.device}",
        dtype=spec.dtype, param_dtype="fp32", shape=work.shape, batch=work.batch_size, seq_len=work.seq_len,
        attention=work.attention, optimizer=work.optimizer_name, dropout=work.dropout,
        tokens_per_step=work.tokens_per_step)
    session = own_session("train", spec, out_dir, config, known)
    session.attach(work.model, [work.optimizer], compiled=spec.compile, device=work.device)
    session.observed.notes.extend(work.notes)
    drive_steps(session, step)
    # Attribution's check (analysis/block_truth.py): a stopwatch around each block, eager only; a model
    # scoped by module hooks gets its forward blocks timed.
    model = work.model if work.scopes is not None else None
    run = close(session, lambda: {} if spec.compile else block_stopwatch(step, STOPWATCH_STEPS, sync, model=model))
    loss = step.last_loss()
    if loss is not None:
        run.metrics[LOSS] = Metric(value=loss, unit="nats/token", source="measured", note="last profiled step")
    return run


def run_training(cfg: TrainConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile the built-in GPT's training step; returns the Run and the folder it was saved in.

    Under torchrun (WORLD_SIZE > 1) every rank profiles itself into ``<run>/rank<r>`` and rank 0
    assembles ``<run>/run.json``; with ``cfg.nproc > 1`` outside torchrun, this launches torchrun.
    """
    with model_scopes_kept():
        return _run_training(cfg, out_dir)


def _run_training(cfg: TrainConfig, out_dir: Path | None) -> tuple[Run, Path]:
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
        # lmprof train is given a model, not a program: when the model's own step fails, one line says so
        with the_models_own_failures(TrainStep(work, cfg.dtype), "training step"):
            run = measure_training(work, cfg, folder, run_config(cfg, described, work, device))
        run.save(folder)
    return run, folder


def run_config(cfg: TrainConfig, described: dict[str, Any], work: TrainWorkload, device: Device) -> dict[str, Any]:
    """The config recorded in run.json: the validated options plus what the model turned out to be."""
    config = cfg.model_dump()
    config.update(described, seq_len=work.seq_len, device_resolved=str(device))
    return config

