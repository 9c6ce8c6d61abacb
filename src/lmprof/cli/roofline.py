"""``lmprof roofline``: an analytic roofline of a GPT on a device, without running anything."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app


@app.command()
def roofline(
    device: Optional[str] = typer.Option(
        None, help="Device: short name (h100, a100, l4, 4090, mi300x, m2-max, ...) or a torch device name; "
        "cpu, cuda, mps use this machine's device (table or `lmprof calibrate` cache)"),
    preset: str = typer.Option("gpt2", help="Model preset: tiny, small or gpt2"),
    model: Optional[str] = typer.Option(
        None, "--model", help="A known model (llama-3-8b, mixtral-8x7b, qwen2.5-7b, ...), a config.json or a model "
        "folder (replaces --preset)"),
    context: Optional[int] = typer.Option(
        None, "--context", help="KV length: keys attended (decode: the cache after appending the new token; "
        "prefill: cache + prompt) [default: --seq-len]"),
    weights: Optional[str] = typer.Option(
        None, "--weights", help="Weight storage: int8 or int4 (weight-only, a 2-byte scale per 128) or a float dtype "
        "[default: --dtype]"),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV cache dtype [default: --dtype]"),
    sweep_batch: Optional[str] = typer.Option(
        None, "--sweep-batch", help="Comma-separated batch sizes: roofline time per token for each (decode by "
        "default), and where the phase turns compute-bound"),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON (see docs/flops-and-roofline.md)"),
    checkpointing: bool = typer.Option(
        False, "--checkpointing/--no-checkpointing", help="train: full activation checkpointing (layers' forward "
        "run again in backward)"),
    list_models: bool = typer.Option(False, "--list-models", help="List the known models and exit"),
    allow_generic: bool = typer.Option(
        False, "--allow-generic", help="A family lmprof cannot describe (no formulas, the describer cannot build it): "
        "a generic Llama-like guess, marked generic (refused for expert, hybrid or latent-attention configs)"),
    dtype: str = typer.Option(
        "bf16", help="fp32, tf32, bf16, fp16 or fp8: the compute dtype and the width of every byte"),
    batch_size: int = typer.Option(1, "--batch-size", "-b", help="Sequences"),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", "-t",
        help="Prompt / training tokens per sequence; for decode, the KV cache length "
        "[default: the preset's block_size]"),
    phase: Optional[str] = typer.Option(
        None, help="[default: prefill; decode with --sweep-batch] ""prefill (prompt), decode (one token against the KV cache) or train (forward + backward)"),
    attention: str = typer.Option("math", help="math (scores/softmax/av blocks) or sdpa (one fused block)"),
    causal: bool = typer.Option(
        False, "--causal/--no-causal", help="Count only attended q-k pairs [default: full T x S, as PaLM/nanoGPT]"),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Override the preset's layers"),
    n_head: Optional[int] = typer.Option(None, "--n-head", help="Override the preset's heads"),
    n_embd: Optional[int] = typer.Option(None, "--n-embd", help="Override the preset's width"),
    out: Optional[Path] = typer.Option(
        None, "--out", "--plot", help="Write the roofline plot (PNG) here [default: no plot]"),
    list_devices: bool = typer.Option(False, "--list-devices", help="List the peak table and exit"),
) -> None:
    """Analytic per-block roofline (FLOPs, bytes, intensity, bound, attainable time): nothing is run."""
    from lmprof.analysis.what_if import RooflineQuery, parse_batches, roofline_what_if
    from lmprof.cli.common import console, interruptible, progress_status
    from lmprof.hardware.peaks import load_table
    from lmprof.outdir import check_not_input, check_output_file
    from lmprof.show.roofline_view import peak_table_lines, show_roofline

    table = load_table()
    if list_models:
        from lmprof.estimate.models import known_models

        console.print("\n".join(known_models()))
        return
    if list_devices:
        for line in peak_table_lines(table):
            console.print(line)
        return
    query = RooflineQuery(
        device=device, preset=preset, model=model, phase=phase, dtype=dtype, batch_size=batch_size, seq_len=seq_len,
        context=context, weights=weights, kv_dtype=kv_dtype,
        sweep_batches=parse_batches(sweep_batch) if sweep_batch else None, attention=attention,
        causal=causal, checkpointing=checkpointing, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        allow_generic=allow_generic)
    if out is not None:
        check_not_input(out, [model if model and Path(model).exists() else None], "--out")
        check_output_file(out, "--out")  # before the work: a folder given as --out is one line, not a traceback
    # a model read off the meta device can take minutes (describe.py): its progress shown, Ctrl-C one line
    with interruptible("reading the model off the meta device did not finish"), progress_status("reading the model"):
        answer = roofline_what_if(query, table)
    if answer.entry is not None and answer.entry.warning:
        typer.echo(f"warning: {answer.entry.warning}", err=True)
    show_roofline(answer, as_json=as_json, out=out, line=console.print, echo=typer.echo)
