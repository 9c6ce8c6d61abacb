"""``lmprof infer``: greedy generations stepped through the one measurement session (pipeline/driven.py):
prefill and decode timed apart, then profiled and attributed per block."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmprof.config import InferConfig, MeasureSpec
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.budget import check_duration
from lmprof import progress
from lmprof.pipeline.driven import close, driven_session, steps_planned, stopped_on_error
from lmprof.pipeline.protocol import incomplete_until_saved, run_folder
from lmprof.pipeline.usercode.session import Generation as Timed
from lmprof.pipeline.usercode.session import Known, Session
from lmprof.record.run import Run
from lmprof.analysis.block_truth import STOPWATCH_STEPS
from lmprof.measure.block_stopwatch import block_stopwatch
from lmprof.workloads.builders import infer_workload
from lmprof.workloads.describe import attention_path
from lmprof.workloads.inference import Generation, InferWorkload, generate
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
        session = driven_session("infer", spec, out_dir, config, work.device, work.model, [], work.notes, known)
        last = _drive(session, work)
        # Attribution's check (analysis/block_truth.py): a stopwatch around each block, eager only; a
        # model scoped by module hooks gets its prefill and decode blocks timed through them.
        model = work.model if work.scopes is not None else None
        stopwatch = (dict if spec.compile else
                     lambda: block_stopwatch(lambda: generate(work), STOPWATCH_STEPS, work.device.synchronize,
                                             model=model))
        known.cache_bytes = work.decoder.cache_bytes()
        run = close(session, stopwatch)
    run.tables["generation"] = [_generation_row(work, last.tokens, i) for i in range(min(B, 4))]
    return run


def _drive(session: Session, work: InferWorkload) -> Generation:
    """Generate until the session's profiled window is complete; the last generation."""
    B, T = work.prompt.size(0), work.prompt.size(1)
    last: Generation | None = None
    done, planned = 0, steps_planned(session)
    with stopped_on_error(session):
        while not (session.collected or session.done):
            session.generation_begin()
            last = generate(work, on_prefill=session.prefill_end)
            session.generation_end(Timed(prefill_s=last.prefill_s, decode_s=last.decode_s,
                                         e2e_s=last.prefill_s + sum(last.decode_s), batch=B, prompt_len=T,
                                         forwards=work.new_tokens))
            done += 1
            progress.report("generation", done, planned)
    assert last is not None
    return last


def _generation_row(work: InferWorkload, tokens: torch.Tensor, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"sequence": i, "new_token_ids": tokens[i].tolist()}
    if work.tokenizer is not None:
        row["prompt"] = work.tokenizer.decode(work.prompt[i].tolist())
        row["output"] = work.tokenizer.decode(tokens[i].tolist())
    return row


def run_inference(cfg: InferConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile greedy generation; returns the Run and the folder it was saved in."""
    device = resolve_device(cfg.device)
    work, described = infer_workload(cfg, device)
    folder = out_dir or run_folder(cfg.out, "infer", cfg.label(), device, batch=cfg.batch_size)
    config = cfg.model_dump()
    config.update(described, seq_len=work.prompt.size(1), device_resolved=str(device))
    if cfg.hf or cfg.hf_config:
        config["hf"] = cfg.hf or cfg.hf_config
    with incomplete_until_saved(folder):
        run = measure_inference(work, cfg, folder, config)
        run.save(folder)
    return run, folder
