"""``lmprof infer``: profile prefill and decode, block by block."""
from __future__ import annotations

from typing import Optional

import typer

from lmprof.cli.app import app
from lmprof.cli.common import COMPILE_MODE, DEVICE
from lmprof.cli.measuring import GIVEN, Measuring, measuring_options
from lmprof.counts import default_help


@app.command()
@measuring_options
def infer(
    download: Optional[bool] = typer.Option(None, "--download/--no-download", help="Allow fetching --hf from the hub"),
    prompt: Optional[str] = typer.Option(None, help="Prompt text (else random tokens of --prompt-len)"),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="Prompt as comma-separated token ids (1,2,3)"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Local tokenizer folder that encodes --prompt"),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Random prompt length [default: 32]"),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Layers (built-in GPT preset or --hf-config)"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="Prompts per batch [default: 1]"),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", "-n", help="Tokens generated per prompt [default: 50]"),
    kv_cache: Optional[bool] = typer.Option(None, "--kv-cache/--no-kv-cache", help="Use a KV cache [default: on]"),
    steps: Optional[int] = typer.Option(None, help=f"Timed generations {default_help('infer', 'steps')}"),
    warmup: Optional[int] = typer.Option(None, help=f"Warm-up generations {default_help('infer', 'warmup')}"),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help=f"Generations under the profiler {default_help('infer', 'profile_steps')}"),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = typer.Option(None, help="fp32, bf16 or fp16 weights [default: fp32]"),
    attention: Optional[str] = typer.Option(None, help="Built-in GPT: math or sdpa [default: math]"),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the built-in GPT (KV cache on)"),
    compile_mode: Optional[str] = COMPILE_MODE,
    seed: Optional[int] = typer.Option(None, help="Seed for weights and prompts [default: 0]"),
    opts: Measuring = GIVEN,
) -> None:
    """Profile generation: time to first token, time per output token, and where each phase's time goes."""
    from lmprof.measure.native_logs import quiet_process

    quiet_process(opts.verbose)  # before torch is imported: its log levels are read then, or at the first profile
    from lmprof.config import InferConfig, build

    from lmprof.errors import ConfigError

    try:
        ids = [int(x) for x in prompt_ids.split(",") if x.strip()] if prompt_ids is not None else None
    except ValueError:
        raise ConfigError(f"--prompt-ids takes comma-separated integers, got {(prompt_ids or '')[:80]!r}") from None
    values = opts.values(
        download=download, prompt=prompt,
        prompt_ids=ids, tokenizer=tokenizer, n_layer=n_layer,
        prompt_len=prompt_len, batch_size=batch_size, new_tokens=new_tokens, kv_cache=kv_cache, steps=steps,
        warmup=warmup, profile_steps=profile_steps, device=device, dtype=dtype, attention=attention,
        compile=compile, compile_mode=compile_mode, seed=seed,
    )
    cfg = build(InferConfig, values)
    opts.check(cfg, cfg.out)
    from lmprof.pipeline.infer import run_inference

    from lmprof.cli._measure import measure_and_show

    what = (f"generating with {cfg.label()} at batch {cfg.batch_size}, {cfg.prompt_len}-token prompts"
            f" + {cfg.new_tokens} new tokens")
    measure_and_show(cfg, what, "profiling generation", lambda: run_inference(cfg), opts.report,
                     opts.log_to)
