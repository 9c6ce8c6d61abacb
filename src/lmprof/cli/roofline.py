"""``lmprof roofline``: an analytic roofline of a GPT on a device, without running anything."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmprof.cli.app import app

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
    dtype: str = typer.Option(
        "bf16", help="fp32, tf32, bf16, fp16 or fp8: the compute dtype and the width of every byte"),
    batch_size: int = typer.Option(1, "--batch-size", "-b", help="Sequences"),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", "-t",
        help="Prompt / training tokens per sequence; for decode, the KV cache length "
        "[default: the preset's block_size]"),
    phase: str = typer.Option(
        "prefill", help="prefill (prompt), decode (one token against the KV cache) or train (forward + backward)"),
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
    from lmprof.analysis.flops import FlopConventions, normalize_dtype, phase_costs
    from lmprof.analysis.roofline import classify
    from lmprof.cli.common import console
    from lmprof.errors import ConfigError, DeviceError
    from lmprof.hardware.calibrate import resolve_peak
    from lmprof.hardware.peaks import load_table
    from lmprof.show.roofline_plot import plot_roofline
    from lmprof.workloads.gpt import preset as gpt_preset

    table = load_table()
    if list_devices:
        _print_table(console, table)
        return
    if not device:
        raise ConfigError("--device is required: a short name such as h100 (see --list-devices), or cpu/cuda/mps")
    if phase not in _PHASES:
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
    cfg = gpt_preset(preset, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    shape = cfg.shape()
    t = seq_len if seq_len is not None else cfg.block_size
    if t <= 0:
        raise ConfigError(f"--seq-len must be positive, got {t}")
    if t > cfg.block_size:
        raise ConfigError(f"--seq-len {t} exceeds the preset's block_size {cfg.block_size} (learned positions)")

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

    conventions = FlopConventions(causal_attention=causal)
    costs = phase_costs(shape, batch=batch_size, seq_len=t, phase=phase, dtype=dt,
                        attention=attention, conventions=conventions)  # type: ignore[arg-type]
    points = [classify(c.name, c.flops, c.bytes, peak.flops_per_s, peak.bytes_per_s, phase=c.phase) for c in costs]
    total_time = sum(p.min_time_s or 0.0 for p in points)

    what = {"prefill": f"prefill of {t} tokens", "decode": f"one decode step at KV length {t}",
            "train": f"training step (forward + backward) of {t} tokens"}[phase]
    console.print(f"lmprof roofline: {preset} ({shape.n_params() / 1e6:.1f}M params, L={shape.n_layer}, "
                  f"d={shape.n_embd}, heads={shape.n_head}, V={shape.vocab_size}), {what}, batch {batch_size}, {dt}")
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
    total_flops = sum(c.flops for c in costs)
    total_bytes = sum(c.bytes for c in costs)
    tokens = batch_size * (1 if phase == "decode" else t)
    console.print("-" * len(head))
    console.print(
        f"total: {_eng(total_flops, 'FLOP')}, {_eng(total_bytes, 'B')}, roofline time {_time(total_time)} "
        f"(blocks run one after another, each at its roof) = {tokens / total_time:,.0f} tokens/s at best"
    )
    path = plot_roofline(
        points, peak_flops=peak.flops_per_s, peak_bytes_per_s=peak.bytes_per_s, out=out,
        device=label, dtype=dt, model=f"{preset} B={batch_size} T={t}", phase=phase, measured=False,
        note=f"peak: {peak.source}",
    )
    console.print(f"wrote {path}")


def _print_table(console, table) -> None:  # type: ignore[no-untyped-def]
    console.print(f"peak table version {table.version} ({', '.join(table.files)}); dense TFLOP/s, GB/s")
    cols = ("fp32", "tf32", "bf16", "fp16", "fp8")
    console.print(f"{'device':<16}{'kind':<6}" + "".join(f"{c:>9}" for c in cols) + f"{'GB/s':>9}  aliases")
    for e in table.entries.values():
        cells = "".join(f"{e.flops[c] / 1e12:>9.4g}" if c in e.flops else f"{'-':>9}" for c in cols)
        bw = f"{e.bytes_per_s / 1e9:>9.4g}" if e.bytes_per_s else f"{'-':>9}"
        console.print(f"{e.key:<16}{e.kind:<6}{cells}{bw}  {', '.join(e.aliases)}")
