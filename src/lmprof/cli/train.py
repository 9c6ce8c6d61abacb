"""``lmprof train``: profile a GPT training step end to end, block by block."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import (console, interruptible, log_to_trackers, merged, plots_wanted, progress_status,
                               write_report)
from lmprof.counts import default_help


@app.command()
def train(
    preset: Optional[str] = typer.Option(None, help="Model preset: tiny, small or gpt2 [default: tiny]"),
    hf: Optional[str] = typer.Option(None, "--hf", help="Train a Hugging Face model: local folder or cached hub id"),
    hf_config: Optional[str] = typer.Option(None, "--hf-config", help="Hugging Face architecture with random weights (gpt2, tiny-llama, ...)"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="Sequences per step [default: 8]"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-t", help="Tokens per sequence [default: per preset]"),
    steps: Optional[int] = typer.Option(None, help=f"Clean timed steps {default_help('train', 'steps')}"),
    warmup: Optional[int] = typer.Option(None, help=f"Warm-up steps, not measured {default_help('train', 'warmup')}"),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help=f"Steps under the profiler {default_help('train', 'profile_steps')}"),
    device: Optional[str] = typer.Option(None, help="auto, cpu, cuda, cuda:N or mps [default: auto]"),
    dtype: Optional[str] = typer.Option(None, help="fp32, bf16 or fp16 (autocast) [default: fp32]"),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the model"),
    compile_mode: Optional[str] = typer.Option(None, "--compile-mode", help="default, reduce-overhead or max-autotune [default: default]"),
    attention: Optional[str] = typer.Option(None, help="math (matmul-softmax-matmul) or sdpa (fused) [default: math]"),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Override the preset's layers"),
    n_head: Optional[int] = typer.Option(None, "--n-head", help="Override the preset's heads"),
    n_embd: Optional[int] = typer.Option(None, "--n-embd", help="Override the preset's width"),
    data: Optional[Path] = typer.Option(None, help="Train on a text file (character-level vocabulary)"),
    optimizer: Optional[str] = typer.Option(None, help="adamw or sgd [default: adamw]"),
    energy: Optional[str] = typer.Option(None, help="auto, off or estimate [default: auto]"),
    tdp_w: Optional[float] = typer.Option(None, "--tdp-w", help="Rated power (W) for --energy estimate"),
    seed: Optional[int] = typer.Option(None, help="Seed for weights and data [default: 0]"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file with any of these options"),
    out: Optional[str] = typer.Option(None, help="Folder that receives the run folder [default: runs]"),
    report: bool = typer.Option(True, "--report/--no-report", help="Write report.html into the run folder"),
    verbose: bool = typer.Option(False, "--verbose", help="Also show torch's own C++ log lines (kineto's profiler_start/stop, allocator warnings)"),
    plots: Optional[bool] = typer.Option(None, "--plots/--no-plots", help="Draw roofline.png and memory.png [default: with the report or --log-to]"),
    log_to: List[str] = typer.Option([], "--log-to", help="Also export the run to tensorboard, mlflow or wandb "
                                     "(repeatable; offline, default destinations: docs/trackers.md)"),
    force: Optional[bool] = typer.Option(None, "--force", help="Run even when the steps asked for would take over an hour"),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Ranks: > 1 launches torchrun with DDP (gloo on CPU, nccl on CUDA)"),
    parallel: Optional[str] = typer.Option(None, "--parallel", help="With --nproc: ddp (replicas) or fsdp (FSDP2 shards) [default: ddp]"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", hidden=True, help="Exact run folder (used by the torchrun launcher)"),
) -> None:
    """Profile training steps (forward, backward, optimizer) and attribute time to every sub-block."""
    from lmprof.measure.native_logs import quiet_process

    quiet_process(verbose)  # before torch is imported: its log levels are read then, or at the first profile
    from lmprof.config import TrainConfig, build, load_yaml

    values = merged(
        load_yaml(config),
        preset=preset, hf=hf, hf_config=hf_config, batch_size=batch_size, seq_len=seq_len, steps=steps, warmup=warmup,
        profile_steps=profile_steps, device=device, dtype=dtype, compile=compile, compile_mode=compile_mode, attention=attention,
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, data=str(data) if data else None,
        optimizer=optimizer, energy=energy, tdp_w=tdp_w, seed=seed, out=out, force=force, nproc=nproc, parallel=parallel,
    )
    cfg = build(TrainConfig, plots_wanted(values, plots, report, log_to))
    from lmprof.outdir import check_output_dir

    check_output_dir(run_dir if run_dir is not None else cfg.out, "--run-dir" if run_dir is not None else "--out")
    if log_to:  # an unknown tracker or a missing package is said before anything is measured
        from lmprof.trackers.export import check_trackers

        check_trackers(log_to)
    if not (cfg.hf or cfg.hf_config):
        from lmprof.workloads.gpt_config import check_preset

        check_preset(cfg.preset)
    # what the user gave was checked above, before torch is imported: a refusal is one quick line
    from lmprof.pipeline.train import run_training
    from lmprof.show.summary import render

    from lmprof.pipeline.distributed import is_distributed, world

    if is_distributed():  # a rank under torchrun: rank 0 reports unless the launcher will
        run, folder = run_training(cfg, out_dir=run_dir)
        if world()[0] == 0 and run_dir is None:
            render(run, console, folder=str(folder))
            write_report(run, folder, report)
            log_to_trackers(folder, log_to)
        return
    from lmprof.cli._oom import gpt_fit, oom_guard

    from lmprof.hardware.devices import resolve_device

    kind = resolve_device(cfg.device).kind
    what = f"training {cfg.label()} at batch {cfg.batch_size}" + (f" x {cfg.seq_len} tokens" if cfg.seq_len else "")
    with interruptible(), progress_status("profiling training steps"), oom_guard(what, gpt_fit(cfg, kind), kind):
        run, folder = run_training(cfg, out_dir=run_dir)
    render(run, console, folder=str(folder))
    write_report(run, folder, report)
    log_to_trackers(folder, log_to)
