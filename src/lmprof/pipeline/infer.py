"""``lmprof infer``: a door that steps greedy generations through the one measurement session, as its own
loop (pipeline/protocol/own_loop.py): prefill and decode timed apart, then profiled and attributed per block."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmprof.config import InferConfig, MeasureSpec
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.budget import check_duration
from lmprof.pipeline.protocol.folder import incomplete_until_saved, run_folder
from lmprof.pipeline.protocol.observed import Known
from lmprof.pipeline.protocol.own_loop import close, drive_generations, own_session, the_models_own_failures
from lmprof.record.run import Run
from lmprof.analysis.block_truth import STOPWATCH_STEPS
from lmprof.measure.block_stopwatch import block_stopwatch
from lmprof.workloads.blocks import model_scopes_kept
from lmprof.workloads.builders import infer_workload
from lmprof.workloads.describe import attention_path
from lmprof.workloads.inference import InferWorkload, generate, own_generation
from lmprof.workloads.precision import dtype_name


def measure_inference(work: InferWorkload, spec: MeasureSpec, out_dir: Path, config: dict[str, Any]) -> Run:
    """Profile greedy generation through the one session; writes the trace into ``out_dir``, returns the Run."""
    B, T, n = work.prompt.size(0), work.prompt.size(1), work.new_tokens
    dtype = dtype_name(next(work.model.parameters()).dtype)
    name = config.get("hf") or config.get("preset") or config.get("model_name")
    known = Known(
        title=f"{name}, batch {B}, prompt {T} + {n} new tokens, {dtype}, {work.device}", dtype=dtype,
        param_dtype=dtype, shape=work.shape, batch=B, seq_len=T, attention=attention_path(work.model), new_tokens=n,
        kv_cache=bool(config.get("kv_cache", True)), tokens_per_step=B * n)
    with torch.inference_mode():
        check_duration(lambda: generate(work), spec.warmup + spec.steps + spec.profile_steps,
                       work.device.synchronize, force=spec.force, what="generations")
        session = own_session("infer", spec, out_dir, config, known)
        session.attach(work.model, [], compiled=spec.compile, device=work.device)
        session.observed.notes.extend(work.notes)
        tokens = drive_generations(session, lambda on_forward: generate(work, on_forward=on_forward), work.prompt)
        # Attribution's check (analysis/block_truth.py): a stopwatch around each block, eager only; a
        # model scoped by module hooks gets its prefill and decode blocks timed through them.
        model = work.model if work.scopes is not None else None
        stopwatch = (dict if spec.compile else
                     lambda: block_stopwatch(lambda: generate(work), STOPWATCH_STEPS, work.device.synchronize,
                                             model=model))
        known.cache_bytes = work.decoder.cache_bytes()
        run = close(session, stopwatch)
    run.tables["generation"] = [_generation_row(work, tokens, i) for i in range(min(B, 4))]
    return run


def _generation_row(work: InferWorkload, tokens: torch.Tensor, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"sequence": i, "new_token_ids": tokens[i].tolist()}
    if work.tokenizer is not None:
        row["prompt"] = work.tokenizer.decode(work.prompt[i].tolist())
        row["output"] = work.tokenizer.decode(tokens[i].tolist())
    return row


def run_inference(cfg: InferConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile greedy generation; returns the Run and the folder it was saved in."""
    with model_scopes_kept():
        return _run_inference(cfg, out_dir)


def _run_inference(cfg: InferConfig, out_dir: Path | None) -> tuple[Run, Path]:
    device = resolve_device(cfg.device)
    work, described = infer_workload(cfg, device)
    folder = out_dir or run_folder(cfg.out, "infer", cfg.label(), device, batch=cfg.batch_size)
    config = cfg.model_dump()
    config.update(described, seq_len=work.prompt.size(1), device_resolved=str(device))
    if cfg.hf or cfg.hf_config:
        config["hf"] = cfg.hf or cfg.hf_config
    with incomplete_until_saved(folder):
        # lmprof infer is given a model, not a program: when the model's own generation fails, one line says so
        with the_models_own_failures(lambda: own_generation(work), "generation"):
            run = measure_inference(work, cfg, folder, config)
        run.save(folder)
    return run, folder
