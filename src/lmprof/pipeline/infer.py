"""``lmprof infer``: prefill and decode, timed apart, then profiled and attributed per block."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from lmprof.config import InferConfig, MeasureSpec
from lmprof.hardware.devices import resolve_device
from lmprof.measure.energy import EnergyMonitor
from lmprof.measure.memory import measure_inference_memory
from lmprof.measure.profiling import op_table, profile_steps
from lmprof.pipeline.budget import check_duration
from lmprof.pipeline.figures import Facts, add_figures
from lmprof.measure.noise import snapshot
from lmprof.measure.compile_events import MEASURED
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
from lmprof.workloads.builders import infer_workload
from lmprof.workloads.inference import Generation, InferWorkload, generate
from lmprof.workloads.precision import dtype_name


def measure_inference(work: InferWorkload, spec: MeasureSpec, out_dir: Path, config: dict[str, Any]) -> Run:
    """The measurement protocol for inference; writes the trace into ``out_dir`` and returns the Run."""
    B, T, n = work.prompt.size(0), work.prompt.size(1), work.new_tokens
    monitor = EnergyMonitor.for_device(work.device, spec.energy, tdp_w=spec.tdp_w, idle_s=spec.idle_s)
    with torch.inference_mode():
        check_duration(lambda: generate(work), spec.warmup + spec.steps + spec.profile_steps,
                       work.device.synchronize, force=spec.force, what="generations")
        monitor.measure_idle()
        watch = watched_warm_up(lambda: generate(work), spec.warmup, work.device.synchronize, spec.compile)
        gens: list[Generation] = []
        before = snapshot()
        _, energy = measured_window(lambda: gens.append(generate(work)), spec.steps, work.device.synchronize, monitor)
        after = snapshot()
        if watch:
            watch.count(MEASURED, len(gens))
            watch.phase("profiled")
        out_dir.mkdir(parents=True, exist_ok=True)
        # Attribution's check (analysis/block_truth.py): a stopwatch around each block, eager only; a
        # model scoped by module hooks gets its prefill and decode blocks timed through them.
        stopwatch = ({} if spec.compile else
                     block_stopwatch(lambda: generate(work), STOPWATCH_STEPS, work.device.synchronize,
                                     model=work.model if work.scopes is not None else None))
        memory = measure_inference_memory(lambda: generate(work), work.model, work.device, out_dir=out_dir)
        cache_bytes = work.decoder.cache_bytes()
        prof = profile_steps(
            lambda: generate(work), work.device.torch_device, out_dir / "trace.json.gz",
            active=spec.profile_steps, around=work.scopes,
        )
    table = load_trace(prof.trace_path)
    prof.ops = op_table(table, prof.steps)
    att = attribute(table, compiled=watch.kernel_graphs() if watch else ())
    ms = 1e3
    e2e = [(g.prefill_s + sum(g.decode_s)) * ms for g in gens]
    metrics: dict[str, Metric] = {
        "ttft": Metric.from_samples([g.prefill_s * ms for g in gens], "ms", "measured",
                                    note=f"prefill of {B} x {T} prompt tokens and the first token's choice"),
        "e2e_latency": Metric.from_samples(e2e, "ms", "measured", note=f"{n} new tokens per sequence"),
        "prefill_tokens_per_s": Metric.from_samples([B * T / g.prefill_s for g in gens], "tokens/s", "derived"),
    }
    if n > 1:
        metrics["tpot"] = Metric.from_samples([d * ms for g in gens for d in g.decode_s], "ms", "measured",
                                              note="time per output token after the first, all decode steps")
        metrics["decode_tokens_per_s"] = Metric.from_samples(
            [B * (n - 1) / sum(g.decode_s) for g in gens], "tokens/s", "derived", note="batch x tokens / decode time")
    else:
        metrics["tpot"] = Metric.na("ms", "one new token: no decode step after the prefill")
    clean = metrics["e2e_latency"].value or 0.0
    metrics.update(overhead_metrics(att, clean, "generation"))
    metrics["params"] = Metric(value=sum(p.numel() for p in work.model.parameters()), unit="count", source="measured")
    run = assemble_run("infer", work.device, out_dir, config, metrics, att, clean, prof, work.notes, energy)
    mark_noise(run, e2e, "generation", before, after, work.device.kind)
    run.blocks = mark_uncertain(run.blocks, stopwatch)
    add_compile_report(run, watch, out_dir)
    dtype = dtype_name(next(work.model.parameters()).dtype)
    attention: Literal["math", "sdpa"] = "sdpa" if any(b.name == "attn.sdpa" for b in run.blocks) else "math"
    name = config.get('hf') or config.get('preset') or config.get('model_name')
    add_figures(run, out_dir, Facts(
        title=f"{name}, batch {B}, prompt {T} + {n} new tokens, {dtype}, {work.device}", dtype=dtype,
        param_dtype=dtype, shape=work.shape, batch=B, seq_len=T, attention=attention, new_tokens=n,
        kv_cache=bool(config.get("kv_cache", True)), memory=memory, cache_bytes=cache_bytes, energy=energy,
        energy_steps=len(gens), tokens_per_step=B * n, plots=spec.plots))
    run.tables["generation"] = [_generation_row(work, gens[-1].tokens, i) for i in range(min(B, 4))]
    return run


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
