"""``lmprof train``: profile a GPT training step end to end, block by block."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import COMPILE_MODE, DEVICE, show_run
from lmprof.cli.measuring import GIVEN, Measuring, measuring_options
from lmprof.counts import default_help


@app.command()
@measuring_options
def train(
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="Sequences per step [default: 8]"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-t", help="Tokens per sequence [default: per preset]"),
    steps: Optional[int] = typer.Option(None, help=f"Clean timed steps {default_help('train', 'steps')}"),
    warmup: Optional[int] = typer.Option(None, help=f"Warm-up steps, not measured {default_help('train', 'warmup')}"),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help=f"Steps under the profiler {default_help('train', 'profile_steps')}"),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = typer.Option(None, help="fp32, bf16 or fp16 (autocast) [default: fp32]"),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the model"),
    compile_mode: Optional[str] = COMPILE_MODE,
    attention: Optional[str] = typer.Option(None, help="math (matmul-softmax-matmul) or sdpa (fused) [default: math]"),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Override the preset's layers"),
    n_head: Optional[int] = typer.Option(None, "--n-head", help="Override the preset's heads"),
    n_embd: Optional[int] = typer.Option(None, "--n-embd", help="Override the preset's width"),
    data: Optional[Path] = typer.Option(None, help="Train on a text file (character-level vocabulary)"),
    optimizer: Optional[str] = typer.Option(None, help="adamw or sgd [default: adamw]"),
    seed: Optional[int] = typer.Option(None, help="Seed for weights and data [default: 0]"),
    opts: Measuring = GIVEN,
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Ranks: > 1 launches torchrun with DDP (gloo on CPU, nccl on CUDA)"),
    parallel: Optional[str] = typer.Option(None, "--parallel", help="With --nproc: ddp (replicas) or fsdp (FSDP2 shards) [default: ddp]"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", hidden=True, help="Exact run folder (used by the torchrun launcher)"),
) -> None:
    """Profile training steps (forward, backward, optimizer) and attribute time to every sub-block."""
    from lmprof.measure.native_logs import quiet_process

    quiet_process(opts.verbose)  # before torch is imported: its log levels are read then, or at the first profile
    from lmprof.config import TrainConfig, build

    values = opts.values(
        batch_size=batch_size, seq_len=seq_len, steps=steps, warmup=warmup,
        profile_steps=profile_steps, device=device, dtype=dtype, compile=compile, compile_mode=compile_mode, attention=attention,
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, data=str(data) if data else None,
        optimizer=optimizer, seed=seed, nproc=nproc, parallel=parallel,
    )
    cfg = build(TrainConfig, values)
    opts.check(cfg, run_dir if run_dir is not None else cfg.out, "--run-dir" if run_dir is not None else "--out")
    from lmprof.pipeline.train import run_training

    from lmprof.pipeline.distributed import is_distributed, world

    if is_distributed():  # a rank under torchrun: rank 0 reports unless the launcher will
        run, folder = run_training(cfg, out_dir=run_dir)
        if world()[0] == 0 and run_dir is None:
            show_run(run, folder, opts.report, opts.log_to)
        return
    from lmprof.cli._measure import measure_and_show

    what = f"training {cfg.label()} at batch {cfg.batch_size}" + (f" x {cfg.seq_len} tokens" if cfg.seq_len else "")
    measure_and_show(cfg, what, "profiling training steps", lambda: run_training(cfg, out_dir=run_dir), opts.report,
                     opts.log_to)
