"""``lmprof memory``: will this model, batch and sequence fit on that device? Checked without running.

Prints the analytic breakdown (params, grads, optimizer state, activations per block, logits, KV
cache, peak), compares the peak with the device's memory and says FITS or DOES NOT FIT, with the
largest batch size that fits. Exit code 0 when it fits, 1 when it does not, 2 on bad input.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import typer

from lmprof.cli.app import app
from lmprof.errors import ConfigError, DeviceError
from lmprof.estimate.facts import SOURCE_NOTES
from lmprof.modes import traits

GIB = 1024**3
GB = 10**9



def _known_gpus() -> dict[str, tuple[str, int]]:
    """Short name (key and aliases) -> (name, nominal bytes), from the one device table (peaks.yaml)."""
    from lmprof.hardware.peaks import load_table

    return load_table().gpu_memory()


def __getattr__(name: str) -> Any:
    # KNOWN_GPUS is kept for callers of the old name, read when asked for: loading the peak table at
    # import time made a broken LMPROF_PEAKS file break every command, --help included.
    if name == "KNOWN_GPUS":
        return _known_gpus()
    raise AttributeError(name)


def device_memory(device: str | None, memory_gb: float | None) -> tuple[str, int, str]:
    """(description, nominal bytes, device kind for the estimate) for the fit check.

    GPU short names come from the device table (hardware/peaks.yaml), ``cpu`` is this machine's RAM,
    ``cuda``/``cuda:N``/``auto`` the local device. ``memory_gb`` (GiB) replaces the capacity.
    See :func:`device_budget` for the bytes the fit check actually allows.
    """
    spec = (device or "auto").strip().lower()
    if spec == "a100":
        raise ConfigError("the A100 comes with 40 or 80 GB: use --device a100-40 or a100-80")
    known = _known_gpus()
    if spec not in known and spec not in ("cpu", "auto", "mps") and not spec.startswith("cuda"):
        raise ConfigError(f"unknown device {device!r}: use cpu, cuda, auto or one of {', '.join(known)}")
    if memory_gb is not None:
        if not (memory_gb > 0 and memory_gb < 2**40):  # also refuses nan and inf
            raise ConfigError(f"--memory-gb must be a positive, finite number of GiB, got {memory_gb}")
        kind = "cpu" if spec == "cpu" or (spec == "auto" and not _cuda()) else "cuda"
        return f"{memory_gb:g} GiB budget", int(memory_gb * GIB), kind
    if spec in known:
        name, capacity = known[spec]
        return name, capacity, "cuda"
    if spec == "cpu":
        return "this machine's RAM", _total_ram(), "cpu"
    return _local_device(spec)


def device_budget(device: str | None, memory_gb: float | None, margin: bool = True) -> tuple[str, int, int, str, str]:
    """(description, nominal bytes, budget bytes, kind, how the budget was derived) for the fit check.

    A table GPU's budget is its usable memory (the driver's total where recorded) minus the margin of
    :func:`lmprof.estimate.fit.fit_budget`; a local CUDA device's is torch's total_memory minus the
    margin; ``--memory-gb`` and the CPU's RAM are taken as given.
    """
    from lmprof.estimate.fit import MARGIN_FIXED, MARGIN_FRACTION, fit_budget
    from lmprof.hardware.peaks import load_table

    name, nominal, kind = device_memory(device, memory_gb)
    spec = (device or "auto").strip().lower()
    if memory_gb is not None or kind == "cpu":
        return name, nominal, nominal, kind, "as given" if memory_gb is not None else "total RAM"
    entry = load_table().find(spec) if spec in _known_gpus() else None
    usable, how = (entry.usable_memory() if entry is not None else (nominal, "torch total_memory"))
    usable = usable or nominal
    if not margin:
        return name, nominal, usable, kind, how
    budget = fit_budget(usable)
    how = (f"usable {usable / GIB:.2f} GiB ({how}) minus {MARGIN_FIXED / GIB:g} GiB (CUDA context, workspaces) "
           f"and {MARGIN_FRACTION:.0%} (allocator fragmentation)")
    return name, nominal, budget, kind, how


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _local_device(spec: str) -> tuple[str, int, str]:
    from lmprof.hardware.devices import resolve_device

    dev = resolve_device(spec)
    if dev.kind == "cuda":
        import torch

        return dev.name, int(torch.cuda.get_device_properties(dev.torch_device).total_memory), "cuda"
    if dev.kind == "mps":
        raise DeviceError("MPS shares the machine's RAM: use --device cpu or give --memory-gb")
    return f"this machine's RAM ({dev.name})", _total_ram(), "cpu"


def _total_ram() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no portable answer without psutil
        raise DeviceError("cannot read this machine's total RAM here: give --memory-gb") from None


def _fmt(n: float) -> str:
    from lmprof.estimate.memory import format_bytes

    return format_bytes(n)


@app.command()
def memory(
    preset: str = typer.Option("tiny", "--preset", help="built-in GPT preset: tiny, small, gpt2"),
    model: Optional[str] = typer.Option(
        None, "--model", help="a known model (llama-3-8b, mixtral-8x7b, ...), a config.json or a model folder "
        "(replaces --preset)"),
    batch_size: int = typer.Option(8, "--batch-size", "-b", help="sequences per step (per GPU)"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", help="tokens per sequence (default: block size)"),
    context: Optional[int] = typer.Option(None, "--context", help="infer: prompt tokens held in the KV cache "
                                          "(same as --seq-len)"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16 (16-bit = autocast with fp32 params)"),
    param_dtype: Optional[str] = typer.Option(
        None, "--param-dtype", help="parameter dtype; bf16/fp16 = 16-bit weights [default fp32; with --model: --dtype]"),
    weights: Optional[str] = typer.Option(None, "--weights", help="infer: weight storage int8 / int4 (group scales) "
                                          "or a float dtype"),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="infer: KV cache dtype (fp8, bf16, ...)"),
    device: Optional[str] = typer.Option(None, "--device", help="h100, a100-80, h200, ..., cpu, cuda (default auto)"),
    memory_gb: Optional[float] = typer.Option(None, "--memory-gb", help="memory budget in GiB (overrides --device)"),
    attention: Optional[str] = typer.Option(
        None, "--attention", help="math (keeps the T x T scores) or sdpa (fused) [default: math; with --model: sdpa]"),
    mode: str = typer.Option("train", "--mode", help="train or infer"),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw, adamw8bit or sgd (momentum)"),
    gpus: int = typer.Option(1, "--gpus", help="GPUs sharing the work (see --shard)"),
    shard: str = typer.Option("ddp", "--shard", help="ddp, zero1, zero2, zero3 or fsdp"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree (Megatron layout; per-device figures)"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel stages (1F1B; the stage with the higher peak)"),
    sp: bool = typer.Option(False, "--sp/--no-sp", help="sequence parallelism on top of --tp"),
    lora_rank: Optional[int] = typer.Option(None, "--lora-rank", help="train LoRA adapters of this rank only"),
    lora_targets: str = typer.Option("attn", "--lora-targets", help="attn (q, k, v, o) or all-linear (+ MLP)"),
    qlora: bool = typer.Option(False, "--qlora", help="QLoRA: frozen base linears in 4-bit NF4 (needs --lora-rank)"),
    double_quant: bool = typer.Option(True, "--double-quant/--no-double-quant",
                                      help="QLoRA: 8-bit absmax constants (default) or fp32 ones"),
    checkpointing: bool = typer.Option(False, "--checkpointing/--no-checkpointing",
                                       help="train: full activation checkpointing (estimated, not validated)"),
    new_tokens: int = typer.Option(0, "--new-tokens", help="infer: generated tokens the KV cache also holds"),
    n_layer: Optional[int] = typer.Option(None, "--n-layer"),
    n_head: Optional[int] = typer.Option(None, "--n-head"),
    n_embd: Optional[int] = typer.Option(None, "--n-embd"),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size"),
    block_size: Optional[int] = typer.Option(None, "--block-size"),
    dropout: Optional[float] = typer.Option(None, "--dropout"),
    hold_logits: bool = typer.Option(False, "--hold-logits",
                                     help="the step keeps the (b, s, V) logits to its end (lmprof's own does not)"),
    blocks: bool = typer.Option(True, "--blocks/--no-blocks", help="show activations per block"),
    as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON"),
    allow_generic: bool = typer.Option(
        False, "--allow-generic", help="a family lmprof cannot describe (no formulas, the describer cannot build "
        "it): a generic Llama-like guess, marked generic (refused for expert, hybrid or latent-attention configs)"),
) -> int:
    """Fit check without running: memory breakdown, peak vs device memory, largest batch that fits."""
    from lmprof.estimate.fit import SHARDS, estimate_plan
    from lmprof.estimate.memory import ATTENTIONS, MODES, MemoryEstimate, largest_fitting_batch
    from lmprof.config import choice
    from lmprof.workloads.gpt_config import preset as make_preset

    for name, value in (("--batch-size", batch_size), ("--seq-len", seq_len), ("--new-tokens", new_tokens),
                        ("--n-layer", n_layer), ("--n-head", n_head), ("--n-embd", n_embd),
                        ("--vocab-size", vocab_size), ("--block-size", block_size), ("--context", context)):
        if value is not None and not 0 <= value < 2**31:  # beyond any device; 10**30 overflows the estimate
            raise ConfigError(f"{name} must be between {0 if name == '--new-tokens' else 1} and {2**31 - 1:,}")
    plan_mode = choice(mode, MODES, f"mode must be 'train' or 'infer', got {mode!r}")
    generates = traits(plan_mode).generates
    attention = attention or ("sdpa" if model is not None else "math")
    facts = None
    figures = "formula"
    if context is not None and seq_len is not None and context != seq_len:
        raise ConfigError("--context and --seq-len both given with different values: give one")
    seq_len = context if context is not None else seq_len
    if model is not None:
        from lmprof.estimate.models import config_positions, resolve_model

        from lmprof.estimate.dropout import Dropout, dropout_at

        entry = resolve_model(model)
        label, pdt = entry.name, param_dtype or dtype
        if entry.figures == "model":
            # A family lmprof's formulas do not know: read off the model on the meta device (imports torch).
            from lmprof.cli.common import interruptible, progress_status
            from lmprof.measure.model_facts.resolve import describe_entry

            positions = config_positions(entry.config or {})
            seq = seq_len if seq_len is not None else min(positions, 4096) - (new_tokens if generates else 0)
            with interruptible("reading the model off the meta device did not finish"), \
                    progress_status("reading the model"):
                entry, facts = describe_entry(entry, allow_generic=allow_generic, batch=batch_size,
                                              seq_len=max(1, seq), dtype=pdt, phases=traits(plan_mode).passes[:1])
        if entry.warning:
            typer.echo(f"warning: {entry.warning}", err=True)
        figures = entry.figures
        # The dropout transformers trains the family with (its config), unless --dropout sets every site.
        drop: float | Dropout = entry.dropout if dropout is None else dropout_at(
            entry.shape.family if entry.shape is not None else "", dropout)
        shape = entry.shape
    else:
        cfg = make_preset(preset, n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
                          block_size=block_size, dropout=dropout, attention=attention)
        shape, label, drop, pdt = cfg.shape(), preset, cfg.dropout, param_dtype or "fp32"
    described = facts if facts is not None else shape
    assert described is not None
    if facts is not None:
        seq = facts.seq_len  # the tokens it was read at
    elif seq_len is None:
        assert shape is not None
        default = shape.block_size if model is None else min(shape.block_size, 4096)
        seq = default - new_tokens if generates else default
    else:
        seq = seq_len
    dev_name, nominal, budget, kind, how = device_budget(device, memory_gb)
    plan_attention = choice(attention, ATTENTIONS, f"attention must be 'math' or 'sdpa', got {attention!r}")
    plan_shard = choice(shard, SHARDS, f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    lora, parallel = _plan(shape, lora_rank, lora_targets, qlora, double_quant, tp, pp, sp, plan_mode)

    def estimate_at(b: int) -> MemoryEstimate:
        return estimate_plan(described, batch=b, seq_len=seq, mode=plan_mode, dtype=dtype, param_dtype=pdt,
                             attention=plan_attention, optimizer=optimizer, device_kind=kind, dropout=drop,
                             new_tokens=new_tokens, hold_logits=hold_logits, gpus=gpus, shard=plan_shard,
                             weights=weights, kv_dtype=kv_dtype, checkpointing=checkpointing, lora=lora,
                             parallel=parallel)

    est = estimate_at(batch_size)
    best = largest_fitting_batch(budget, estimate_at)
    fits = est.peak <= budget
    best_context = None
    if generates and shape is not None:  # the largest prompt the cache can hold, up to the model's maximum
        from lmprof.estimate.fit import largest_fitting

        def peak_with_context(c: int) -> int:
            return estimate_plan(shape, batch=batch_size, seq_len=c, mode="infer", dtype=dtype, param_dtype=pdt,
                                 attention=plan_attention, device_kind=kind, new_tokens=new_tokens,
                                 gpus=gpus, shard=plan_shard, weights=weights, kv_dtype=kv_dtype,
                                 parallel=parallel).peak

        best_context = largest_fitting(budget, peak_with_context, shape.block_size - new_tokens)
    if as_json:
        from lmprof.printable import json_text

        total, active = ((facts.params, facts.params_active) if facts is not None else
                         (shape.n_params(), shape.n_params(active=True)) if shape is not None else (0, 0))
        data = {"estimate": est.to_dict(), "model": label, "source": figures, "source_note": SOURCE_NOTES[figures],
                "device": dev_name, "capacity": nominal,
                "budget": budget, "budget_note": how, "fits": fits, "largest_batch": best,
                "largest_context": best_context, "devices": gpus * tp * pp,
                "params_total": total, "params_active": active,
                "memory": {k: v for k, v in est.at_peak.items()}, "peak": est.peak}
        typer.echo(json_text(data))
        return 0 if fits else 1
    devices = (f"{gpus} data-parallel x {tp} tensor-parallel x {pp} pipeline = {gpus * tp * pp} devices; "
               "every figure is one device's") if gpus * tp * pp > 1 else ""
    _print_report(est, label, dev_name, nominal, budget, how, fits, best, blocks, estimate_at, devices, figures)
    if generates and shape is None:
        typer.echo(f"largest context that fits at batch {batch_size}: not searched (figures read off the model at "
                   f"{seq:,} prompt tokens; give another --context to check one)")
    if best_context is not None and shape is not None:
        typer.echo(f"largest context that fits at batch {batch_size}: "
                   + (f"{best_context:,} tokens (model maximum {shape.block_size:,})" if best_context
                      else "none (a 1-token prompt is already too large)"))
    return 0 if fits else 1


def _plan(shape: Any, rank: int | None, targets: str, qlora: bool, double_quant: bool, tp: int, pp: int, sp: bool,
          mode: str) -> tuple[Any, Any]:
    """The LoRA plan (None without --lora-rank) and the parallel degrees, checked against the shape."""
    from lmprof.estimate.memory.lora import LORA_TARGETS, Lora
    from lmprof.estimate.memory.parallel import Parallel
    from lmprof.config import choice

    parallel = Parallel(tp=tp, pp=pp, sp=sp)
    if shape is None:  # a model the describer read: estimate_plan says what is not modelled for it
        lora = Lora(rank=rank, targets="attn") if rank is not None else None
        return lora, parallel
    parallel.check(shape)
    if rank is None:
        if qlora:
            raise ConfigError("--qlora needs --lora-rank R (the adapters' rank)")
        if targets != "attn":
            raise ConfigError("--lora-targets needs --lora-rank R")
        return None, parallel
    plan_targets = choice(targets, LORA_TARGETS, f"--lora-targets must be one of {', '.join(LORA_TARGETS)}, "
                          f"got {targets!r}")
    lora = Lora(rank=rank, targets=plan_targets, qlora=qlora, double_quant=double_quant)
    lora.check(shape)
    if not traits(mode).trains:
        raise ConfigError("--lora-rank is for training (--mode train); for inference merge the adapters or use "
                          "--weights int4")
    return lora, parallel


def _print_report(est: Any, preset: str, dev_name: str, capacity: int, budget: int, how: str, fits: bool, best: int,
                  blocks: bool, estimate_at: Any, devices: str = "", figures: str = "formula") -> None:
    mixed = est.dtype != "fp32" and est.param_dtype == "fp32"
    trains = traits(est.mode).trains
    what = "train step" if trains else f"inference (KV cache of {est.kv_tokens} tokens)"
    opt = f", {est.optimizer} ({est.optimizer_impl})" if trains else ""
    echo = typer.echo
    echo(f"lmprof memory: {preset} ({est.n_params:,} params), {what}, batch {est.batch} x seq {est.seq_len}, "
         f"{est.dtype}{' autocast' if mixed else ''}, attention {est.attention}{opt}")
    echo(f"regime: {est.regime}")
    echo(f"source: {figures} ({SOURCE_NOTES[figures]})")
    for line in est.plan:
        echo(f"plan: {line}")
    if devices:
        echo(f"devices: {devices}")
    echo("")
    echo(f"  {'category':<13}{'bytes':>16}{'size':>12}{'at peak':>12}   note")
    for row in est.breakdown():
        if row["category"] == "peak":
            echo(f"  {'-' * 13}{'-' * 16}{'-' * 12}{'-' * 12}")
        echo(f"  {row['category']:<13}{row['bytes']:>16,}{_fmt(row['bytes']):>12}{_fmt(row['at_peak']):>12}"
             f"   {row['note']}")
    if blocks and trains:
        echo("")
        layers = est.stage_layers or est.n_layer
        flight = f", x{est.in_flight} micro-batches" if est.in_flight > 1 else ""
        echo(f"  activations saved for backward, per layer (x{layers}{flight}) then once "
             "(Korthikanti et al. 2022, adapted):" if est.shape is not None else
             "  activations saved for backward by block (read off the model, all layers):")
        shown = [it for it in est.items if it.bytes]
        # columns as wide as their longest entry (an MoE's descriptions ran into its formulas)
        wb, ww, wf = (max([n, *(len(x) for x in col)]) + 1 for n, col in (
            (12, [it.block for it in shown]), (33, [it.what for it in shown]), (21, [it.formula for it in shown])))
        for it in shown:
            where = "layer" if it.per_layer else "once"
            echo(f"    {it.block:<{wb}}{it.what:<{ww}}{it.formula:<{wf}}{_fmt(it.bytes):>11}  {where}")
    echo("")
    echo("  candidate peaks: " + ", ".join(f"{k} {_fmt(v)}" for k, v in est.moments.items()))
    echo("")
    for note in est.notes:
        echo(f"note: {note}")
    pct = 100.0 * est.peak / budget if budget else float("inf")
    echo(f"device: {dev_name}: {_fmt(capacity)}")
    echo(f"budget: {_fmt(budget)} = {how}")
    verdict = "FITS" if fits else "DOES NOT FIT"
    echo(f"{verdict}: peak {_fmt(est.peak)} is {pct:.0f}% of the {_fmt(budget)} budget (at {est.peak_at})")
    if best:
        echo(f"largest batch size that fits: {best} (peak {_fmt(estimate_at(best).peak)})")
    else:
        echo("largest batch size that fits: none (batch 1 is already too large)")
    echo("not counted: other processes on the device")
