"""``lmprof roofline``: an analytic roofline of a GPT on a device, without running anything."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app
from lmprof.errors import ConfigError

_LOCAL = ("cpu", "cuda", "mps", "auto")
_PHASES = ("prefill", "decode", "train")


def _eng(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


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
    out: Path = typer.Option(Path("roofline.png"), help="PNG to write"),
    list_devices: bool = typer.Option(False, "--list-devices", help="List the peak table and exit"),
) -> None:
    """Analytic per-block roofline (FLOPs, bytes, intensity, bound, attainable time): nothing is run."""
    from lmprof.analysis.flops import FlopConventions, normalize_dtype
    from lmprof.analysis.roofline import PhaseRoofline, phase_roofline
    from lmprof.dtypes import normalize_weight_dtype
    from lmprof.cli.common import console
    from lmprof.errors import ConfigError, DeviceError
    from lmprof.hardware.calibrate import resolve_peak
    from lmprof.hardware.peaks import load_table
    from lmprof.show.roofline_plot import plot_roofline
    from lmprof.workloads.gpt import preset as gpt_preset

    table = load_table()
    if list_models:
        from lmprof.workloads.models import known_models

        console.print("\n".join(known_models()))
        return
    if list_devices:
        _print_table(console, table)
        return
    if not device:
        raise ConfigError("--device is required: a short name such as h100 (see --list-devices), or cpu/cuda/mps")
    if phase is not None and phase not in _PHASES:
        raise ConfigError(f"unknown phase {phase!r}: use one of {', '.join(_PHASES)}")
    if batch_size <= 0:
        raise ConfigError(f"--batch-size must be positive, got {batch_size}")
    for name, value in (("--batch-size", batch_size), ("--seq-len", seq_len), ("--n-layer", n_layer),
                        ("--n-head", n_head), ("--n-embd", n_embd)):
        if value is not None and not 0 < value < 2**31:  # beyond any device: the figures would be nonsense
            raise ConfigError(f"{name} must be between 1 and {2**31 - 1:,}")
    from lmprof.outdir import check_output_file

    check_output_file(out, "--out")  # before the work: a folder given as --out is one line, not a traceback
    dt = normalize_dtype(dtype)
    if weights is not None:
        normalize_weight_dtype(weights)
    if kv_dtype is not None:
        normalize_dtype(kv_dtype)
    if model is not None:
        from lmprof.workloads.models import resolve_model

        shape = resolve_model(model).shape
        name = resolve_model(model).name
        default_t = min(shape.block_size, 2048)
    else:
        cfg = gpt_preset(preset, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        shape, name, default_t = cfg.shape(), preset, cfg.block_size
    phase = phase or ("decode" if sweep_batch else "prefill")
    if phase not in _PHASES:
        raise ConfigError(f"unknown phase {phase!r}: use one of {', '.join(_PHASES)}")
    t = seq_len if seq_len is not None else (context if (context is not None and phase == "decode") else default_t)
    if t <= 0:
        raise ConfigError(f"--seq-len must be positive, got {t}")
    kv_len = context if context is not None else t  # keys attended
    limit = "block_size" if model is None else "maximum context (max_position_embeddings)"
    checks = (("--context" if context is not None else "--seq-len", kv_len),) if phase == "decode" else (
        ("--seq-len", t), ("--context", kv_len))
    for what, value in checks:
        if value > shape.block_size:
            raise ConfigError(f"{what} {value} exceeds the model's {limit} {shape.block_size}")
    if phase != "decode" and kv_len < t:
        raise ConfigError(f"--context ({kv_len}) must be at least --seq-len ({t}) for {phase}")
    batches = _parse_batches(sweep_batch) if sweep_batch else [batch_size]

    if device.strip().lower() in _LOCAL or device.strip().lower().startswith("cuda:"):
        from lmprof.hardware.devices import resolve_device

        dev = resolve_device(device)
        device_name, kind = dev.name, dev.kind
        label = dev.name
    else:
        entry = table.find(device)
        if entry is None:
            raise DeviceError(
                f"unknown device {device!r}: not in the peak table; use one of {', '.join(table.entries)} "
                "(see --list-devices for aliases), or cpu/cuda/mps with `lmprof calibrate`, "
                "or add it to ~/.config/lmprof/peaks.yaml"
            )
        device_name, kind = entry.key, entry.kind
        label = entry.name
    peak = resolve_peak(device_name, kind, dt, table=table)
    if not peak.flops_per_s or not peak.bytes_per_s:
        raise DeviceError(f"no {dt} roofline for {label}: {peak.note}")

    conventions = FlopConventions(causal_attention=causal, prefill_logits="last" if model is None else "all")
    if weights and weights.lower() in ("int8", "int4") and dt not in ("bf16", "fp16", "fp32", "tf32"):
        raise ConfigError(f"--weights {weights} dequantises into --dtype; use bf16 or fp16, got {dt}")

    def run_at(b: int) -> tuple[list, PhaseRoofline]:
        costs = _costs(shape, phase, b, t, kv_len, dt, attention, conventions, weights, kv_dtype, checkpointing)
        tokens = b * (1 if phase == "decode" else t)
        return costs, phase_roofline(costs, b, tokens, peak.flops_per_s, peak.bytes_per_s)

    if sweep_batch:
        rows = [run_at(b)[1] for b in batches]
        turn = next((r.batch for r in rows if r.bound == "compute-bound"), None)
        if as_json:
            _echo_json({"model": name, "device": device_name, "dtype": dt, "phase": phase, "kv_length": kv_len,
                        "weights": weights or dt, "kv_dtype": kv_dtype or dt,
                        "params_total": shape.n_params(), "params_active": shape.n_params(active=True),
                        "sweep": [{"batch": r.batch, "flops": r.flops, "bytes": r.bytes, "time_s": r.time_s,
                                   "time_per_token_s": r.time_s / r.tokens, "tokens_per_s": r.tokens_per_s,
                                   "bound": r.bound} for r in rows],
                        "compute_bound_from_batch": turn})
            return
        console.print(f"lmprof roofline sweep: {name}, {phase} at KV length {kv_len}, {dt} on {device_name}; "
                      f"weights {weights or dt}, KV {kv_dtype or dt}")
        console.print(f"{'batch':>7}{'FLOPs':>12}{'bytes':>12}{'time':>11}{'tokens/s':>14}  bound")
        for r in rows:
            console.print(f"{r.batch:>7}{_eng(r.flops):>12}{_eng(r.bytes, 'B'):>12}{_time(r.time_s):>11}"
                          f"{r.tokens_per_s:>14,.0f}  {r.bound}")
        console.print(f"compute-bound from batch {turn}" if turn else
                      "memory-bound at every batch swept: weights and KV reads dominate")
        return

    costs, result = run_at(batch_size)
    points = list(result.points)
    total_time = result.time_s
    what = {"prefill": f"prefill of {t} tokens" + (f" (KV length {kv_len})" if kv_len != t else ""),
            "decode": f"one decode step at KV length {kv_len}",
            "train": f"training step (forward + backward) of {t} tokens"}[phase]
    tokens = result.tokens
    if as_json:
        _echo_json({"model": name, "device": device_name, "dtype": dt, "phase": phase, "batch": batch_size,
                    "seq_len": t, "kv_length": kv_len, "weights": weights or dt, "kv_dtype": kv_dtype or dt,
                    "params_total": shape.n_params(), "params_active": shape.n_params(active=True),
                    "peak_flops_per_s": peak.flops_per_s, "peak_bytes_per_s": peak.bytes_per_s,
                    "conventions": conventions.to_dict(),
                    "blocks": [{**c.to_dict(), "bound": p.bound, "time_s": p.min_time_s} for c, p in zip(costs, points)],
                    "total": {"flops": result.flops, "bytes": result.bytes, "time_s": total_time,
                              "tokens_per_s": result.tokens_per_s}})
        return
    console.print(f"lmprof roofline: {name} ({shape.n_params() / 1e6:.1f}M params"
                  + (f", {shape.n_params(active=True) / 1e6:.1f}M active" if shape.moe else "")
                  + f", L={shape.n_layer}, d={shape.n_embd}, heads={shape.n_head}, V={shape.vocab_size}), {what}, "
                  f"batch {batch_size}, {dt}" + (f", weights {weights}" if weights else "")
                  + (f", KV {kv_dtype}" if kv_dtype else ""))
    console.print(f"device: {device_name} ({kind}): {_eng(peak.flops_per_s, 'FLOP/s')} {dt}, "
                  f"{_eng(peak.bytes_per_s, 'B/s')}; ridge {peak.ridge:.3g} FLOP/byte")
    console.print(f"peak source: {peak.source}" + (f"; bandwidth: {peak.bytes_source}" if peak.bytes_source else ""))
    console.print("conventions:")
    for line in conventions.describe().splitlines():
        console.print(f"  {line}")
    show_phase = phase == "train"
    head = f"{'block':<14}" + (f"{'phase':<10}" if show_phase else "") + (
        f"{'x':>4}{'FLOPs':>13}{'bytes':>12}{'FLOP/B':>10}  {'bound':<14}{'time':>11}{'share':>8}")
    console.print(head)
    console.print("-" * len(head))
    for c, p in zip(costs, points):
        share = 100.0 * (p.min_time_s or 0.0) / total_time if total_time else 0.0
        console.print(
            f"{c.name:<14}" + (f"{c.phase:<10}" if show_phase else "")
            + f"{c.count:>4}{_eng(c.flops):>13}{_eng(c.bytes, 'B'):>12}{p.intensity:>10.3g}  {p.bound:<14}"
            f"{_time(p.min_time_s or 0.0):>11}{share:>7.1f}%"
        )
    console.print("-" * len(head))
    console.print(
        f"total: {_eng(result.flops, 'FLOP')}, {_eng(result.bytes, 'B')}, roofline time {_time(total_time)} "
        f"(blocks run one after another, each at its roof) = {tokens / total_time:,.0f} tokens/s at best"
    )
    path = plot_roofline(
        points, peak_flops=peak.flops_per_s, peak_bytes_per_s=peak.bytes_per_s, out=out,
        device=label, dtype=dt, model=f"{name} B={batch_size} T={t}", phase=phase, measured=False,
        note=f"peak: {peak.source}",
    )
    console.print(f"wrote {path}")


def _costs(shape, phase, batch, t, kv_len, dt, attention, conventions, weights, kv_dtype,  # type: ignore[no-untyped-def]
           checkpointing=False):
    """Block costs of the phase: decode is ONE step at KV length kv_len (the cache after appending)."""
    from lmprof.analysis.flops import block_costs, phase_costs

    kw = dict(dtype=dt, attention=attention, conventions=conventions, weight_dtype=weights, kv_dtype=kv_dtype)
    if phase == "train":
        return phase_costs(shape, batch=batch, seq_len=t, phase="train", checkpointing=checkpointing, **kw)
    if phase == "decode":
        return block_costs(shape, batch=batch, seq_len=1, phase="decode", context=kv_len, **kw)
    return block_costs(shape, batch=batch, seq_len=t, phase="prefill", context=kv_len, **kw)


def _parse_batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--sweep-batch takes comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"--sweep-batch takes positive integers, got {text!r}")
    return values


def _echo_json(data: dict) -> None:  # type: ignore[type-arg]
    import orjson

    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())


def _print_table(console, table) -> None:  # type: ignore[no-untyped-def]
    console.print(f"peak table version {table.version} ({', '.join(table.files)}); dense TFLOP/s, GB/s")
    cols = ("fp32", "tf32", "bf16", "fp16", "fp8")
    console.print(f"{'device':<16}{'kind':<6}" + "".join(f"{c:>9}" for c in cols) + f"{'GB/s':>9}  aliases")
    for e in table.entries.values():
        cells = "".join(f"{e.flops[c] / 1e12:>9.4g}" if c in e.flops else f"{'-':>9}" for c in cols)
        bw = f"{e.bytes_per_s / 1e9:>9.4g}" if e.bytes_per_s else f"{'-':>9}"
        console.print(f"{e.key:<16}{e.kind:<6}{cells}{bw}  {', '.join(e.aliases)}")
