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

GIB = 1024**3
GB = 10**9

# Nominal memory of GPUs users name without having one at hand: (name, bytes).
KNOWN_GPUS: dict[str, tuple[str, int]] = {
    "h100": ("NVIDIA H100 80GB", 80 * GIB),
    "h100-80": ("NVIDIA H100 80GB", 80 * GIB),
    "h100-nvl": ("NVIDIA H100 NVL 94GB", 94 * GB),
    "h200": ("NVIDIA H200 141GB", 141 * GB),
    "a100-40": ("NVIDIA A100 40GB", 40 * GIB),
    "a100-80": ("NVIDIA A100 80GB", 80 * GIB),
    "v100": ("NVIDIA V100 16GB", 16 * GIB),
    "v100-32": ("NVIDIA V100 32GB", 32 * GIB),
    "t4": ("NVIDIA T4 16GB", 16 * GIB),
    "l4": ("NVIDIA L4 24GB", 24 * GIB),
    "a10g": ("NVIDIA A10G 24GB", 24 * GIB),
    "l40s": ("NVIDIA L40S 48GB", 48 * GIB),
    "rtx3090": ("NVIDIA GeForce RTX 3090", 24 * GIB),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 24 * GIB),
    "b200": ("NVIDIA B200 180GB", 180 * GB),
    "mi250x": ("AMD Instinct MI250X (one GCD)", 64 * GIB),
    "mi300x": ("AMD Instinct MI300X", 192 * GB),
}


def device_memory(device: str | None, memory_gb: float | None) -> tuple[str, int, str]:
    """(description, bytes, device kind for the estimate) for the fit check.

    Known GPU short names come from :data:`KNOWN_GPUS`, ``cpu`` is this machine's RAM,
    ``cuda``/``cuda:N``/``auto`` the local device. ``memory_gb`` (GiB) replaces the capacity.
    """
    spec = (device or "auto").strip().lower()
    if spec == "a100":
        raise ConfigError("the A100 comes with 40 or 80 GB: use --device a100-40 or a100-80")
    if spec not in KNOWN_GPUS and spec not in ("cpu", "auto", "mps") and not spec.startswith("cuda"):
        raise ConfigError(f"unknown device {device!r}: use cpu, cuda, auto or one of {', '.join(KNOWN_GPUS)}")
    if memory_gb is not None:
        if not (memory_gb > 0 and memory_gb < 2**40):  # also refuses nan and inf
            raise ConfigError(f"--memory-gb must be a positive, finite number of GiB, got {memory_gb}")
        kind = "cpu" if spec == "cpu" or (spec == "auto" and not _cuda()) else "cuda"
        return f"{memory_gb:g} GiB budget", int(memory_gb * GIB), kind
    if spec in KNOWN_GPUS:
        name, capacity = KNOWN_GPUS[spec]
        return name, capacity, "cuda"
    if spec == "cpu":
        return "this machine's RAM", _total_ram(), "cpu"
    return _local_device(spec)


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
    from lmprof.analysis.memory_estimate import format_bytes

    return format_bytes(n)


@app.command()
def memory(
    preset: str = typer.Option("tiny", "--preset", help="built-in GPT preset: tiny, small, gpt2"),
    batch_size: int = typer.Option(8, "--batch-size", "-b", help="sequences per step"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", help="tokens per sequence (default: block size)"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16 (16-bit = autocast with fp32 params)"),
    param_dtype: str = typer.Option("fp32", "--param-dtype", help="parameter dtype; bf16/fp16 = 16-bit weights"),
    device: Optional[str] = typer.Option(None, "--device", help="h100, a100-80, h200, ..., cpu, cuda (default auto)"),
    memory_gb: Optional[float] = typer.Option(None, "--memory-gb", help="memory budget in GiB (overrides --device)"),
    attention: str = typer.Option("math", "--attention", help="math (keeps the T x T scores) or sdpa (fused)"),
    mode: str = typer.Option("train", "--mode", help="train or infer"),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw or sgd (momentum)"),
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
) -> int:
    """Fit check without running: memory breakdown, peak vs device memory, largest batch that fits."""
    from lmprof.analysis.memory_estimate import estimate_memory, largest_fitting_batch
    from lmprof.workloads.gpt import preset as make_preset

    for name, value in (("--batch-size", batch_size), ("--seq-len", seq_len), ("--new-tokens", new_tokens),
                        ("--n-layer", n_layer), ("--n-head", n_head), ("--n-embd", n_embd),
                        ("--vocab-size", vocab_size), ("--block-size", block_size)):
        if value is not None and not 0 <= value < 2**31:  # beyond any device; 10**30 overflows the estimate
            raise ConfigError(f"{name} must be between {0 if name == '--new-tokens' else 1} and {2**31 - 1:,}")
    cfg = make_preset(preset, n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
                      block_size=block_size, dropout=dropout, attention=attention)
    shape = cfg.shape()
    seq = seq_len if seq_len is not None else (cfg.block_size - new_tokens if mode == "infer" else cfg.block_size)
    dev_name, capacity, kind = device_memory(device, memory_gb)

    def estimate_at(b: int) -> Any:
        return estimate_memory(shape, batch=b, seq_len=seq, mode=mode, dtype=dtype,  # type: ignore[arg-type]
                               param_dtype=param_dtype, attention=attention,  # type: ignore[arg-type]
                               optimizer=optimizer, device_kind=kind, dropout=cfg.dropout,  # type: ignore[arg-type]
                               new_tokens=new_tokens, hold_logits=hold_logits)

    est = estimate_at(batch_size)
    best = largest_fitting_batch(capacity, estimate_at)
    fits = est.peak <= capacity
    if as_json:
        import orjson

        data = {"estimate": est.to_dict(), "device": dev_name, "capacity": capacity, "fits": fits,
                "largest_batch": best}
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return 0 if fits else 1
    _print_report(est, preset, dev_name, capacity, fits, best, blocks, estimate_at)
    return 0 if fits else 1


def _print_report(est: Any, preset: str, dev_name: str, capacity: int, fits: bool, best: int, blocks: bool,
                  estimate_at: Any) -> None:
    mixed = est.dtype != "fp32" and est.param_dtype == "fp32"
    what = "train step" if est.mode == "train" else f"inference (KV cache of {est.kv_tokens} tokens)"
    opt = f", {est.optimizer} ({est.optimizer_impl})" if est.mode == "train" else ""
    echo = typer.echo
    echo(f"lmprof memory: {preset} ({est.n_params:,} params), {what}, batch {est.batch} x seq {est.seq_len}, "
         f"{est.dtype}{' autocast' if mixed else ''}, attention {est.attention}{opt}")
    echo(f"regime: {est.regime}")
    echo("")
    echo(f"  {'category':<13}{'bytes':>16}{'size':>12}{'at peak':>12}   note")
    for row in est.breakdown():
        if row["category"] == "peak":
            echo(f"  {'-' * 13}{'-' * 16}{'-' * 12}{'-' * 12}")
        echo(f"  {row['category']:<13}{row['bytes']:>16,}{_fmt(row['bytes']):>12}{_fmt(row['at_peak']):>12}"
             f"   {row['note']}")
    if blocks and est.mode == "train":
        echo("")
        echo(f"  activations saved for backward, per layer (x{est.shape.n_layer}) then once "
             "(Korthikanti et al. 2022, adapted):")
        for it in est.items:
            if it.bytes:
                where = "layer" if it.per_layer else "once"
                echo(f"    {it.block:<13}{it.what:<34}{it.formula:<22}{_fmt(it.bytes):>11}  {where}")
    echo("")
    echo("  candidate peaks: " + ", ".join(f"{k} {_fmt(v)}" for k, v in est.moments.items()))
    echo("")
    pct = 100.0 * est.peak / capacity if capacity else float("inf")
    echo(f"device: {dev_name}: {_fmt(capacity)}")
    verdict = "FITS" if fits else "DOES NOT FIT"
    echo(f"{verdict}: peak {_fmt(est.peak)} is {pct:.0f}% of {_fmt(capacity)} (at {est.peak_at})")
    if best:
        echo(f"largest batch size that fits: {best} (peak {_fmt(estimate_at(best).peak)})")
    else:
        echo("largest batch size that fits: none (batch 1 is already too large)")
    echo("not counted: CUDA context and kernels' workspaces (~0.5-1 GiB), allocator fragmentation, "
         "other processes")
