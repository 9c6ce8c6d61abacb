"""``lmprof calibrate``: measure this machine's achievable matmul FLOP/s and memory bandwidth."""
from __future__ import annotations

from typing import Optional

import math

import typer

from lmprof.cli.app import app


@app.command()
def calibrate(
    device: str = typer.Option("cpu", help="auto, cpu, cuda, cuda:N or mps"),
    dtypes: str = typer.Option("fp32,bf16", help="Comma-separated matmul dtypes: fp32, tf32 (CUDA), bf16, fp16, fp64"),
    seconds: Optional[float] = typer.Option(None, help="Total time budget [default: 3 on CPU, 10 on CUDA, 8 on MPS]"),
    sizes: Optional[str] = typer.Option(None, help="Comma-separated square matmul sizes to try [default: per device]"),
    no_save: bool = typer.Option(False, "--no-save", help="Measure and print, but do not cache the result"),
    if_missing: bool = typer.Option(False, "--if-missing", help="Do nothing when this device already has a cached calibration"),
) -> None:
    """Time square matmuls per dtype and a large copy; cache them for MFU and rooflines.

    Used by MFU and the roofline when the peak table does not know the device (CPUs, unlisted GPUs).
    The cache is $LMPROF_CACHE_DIR (default ~/.cache/lmprof), one JSON file per host and device.
    A calibration whose repeats disagree (p90/p10 above 1.25x) or that ran while other processes kept
    the machine busy is refused: printed with its spread, not saved, exit code 1.
    """
    from lmprof.config import check_device_spec

    check_device_spec(device)  # a mistyped device is said before torch is imported
    from lmprof.cli.common import console
    from lmprof.errors import ConfigError
    from lmprof.hardware.calibrate import cache_dir, calibrate as run_calibration
    from lmprof.hardware.peaks import load_table

    wanted = [d.strip() for d in dtypes.split(",") if d.strip()]
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()] if sizes else None
    except ValueError:
        raise ConfigError(f"--sizes must be comma-separated integers, got {sizes!r}") from None
    if size_list is not None and any(n <= 0 for n in size_list):
        raise ConfigError("--sizes must be positive")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"--seconds must be a positive number, got {seconds}")
    if if_missing:
        from lmprof.hardware.calibrate import load_calibration
        from lmprof.hardware.devices import resolve_device

        dev = resolve_device(device)
        cached = load_calibration(dev.name, dev.kind)
        if cached is not None and not cached.quick:  # a run's quick bandwidth check is no calibration
            console.print(f"calibration of {dev.name} ({dev.kind}) already cached: {cached.path} (rerun without --if-missing to refresh)")
            return
    from lmprof.cli._oom import matmul_fit, oom_guard
    from lmprof.errors import LmprofError
    from lmprof.hardware.calibrate import save_calibration
    from lmprof.outdir import check_output_dir

    # Judge the cache folder before measuring: a calibration is taken to be cached, so a cache that
    # cannot be written (HOME or LMPROF_CACHE_DIR pointing at a file or /proc) is one line, exit 2,
    # before the seconds of measuring; --no-save measures and prints without it.
    unsaved = "--no-save" if no_save else None
    if unsaved is None:
        try:
            check_output_dir(cache_dir(), "the calibration cache")
        except LmprofError as exc:
            raise ConfigError(f"{exc}; set LMPROF_CACHE_DIR to a writable folder, or measure without saving: "
                              "--no-save") from None
    what = "calibrating matmuls" + (f" of sizes {sizes}" if sizes else "")
    with oom_guard(what, matmul_fit(), "cpu" if device == "cpu" else device.split(":")[0]):
        # judged there: the load average and other processes' CPU time over the calibration
        cal = run_calibration(device, wanted, seconds=seconds, sizes=size_list, save=False)
    if cal.disturbed is not None and unsaved is None:
        unsaved = "refused"
    if unsaved is None:
        try:
            save_calibration(cal)
        except (LmprofError, OSError) as exc:
            unsaved = str(exc)

    console.print(
        f"lmprof calibrate: {cal.device_name} ({cal.device}), torch {cal.torch}, {cal.threads} threads, "
        f"{cal.seconds:g} s budget, host {cal.hostname}"
    )
    entry = load_table().find(cal.device_name, cal.device)
    for dt, m in cal.matmul.items():
        line = (f"  {dt + ' matmul':<12}{m['flops_per_s'] / 1e9:>10,.1f} GFLOP/s  best n={m['size']}, median of {m['n']}, "
                f"p90/p10 {m.get('spread', 1.0):.2f}x")
        if entry is not None and entry.flops_for(dt):
            line += f" ({100 * m['flops_per_s'] / entry.flops_for(dt):.0f}% of the {entry.key} datasheet peak)"
        console.print(line)
        console.print("      by size (GFLOP/s): "
                      + ", ".join(f"{n}: {v['flops_per_s'] / 1e9:,.1f}" for n, v in m["by_size"].items()))
    bw = cal.bandwidth
    line = (f"  {'memory':<12}{bw['bytes_per_s'] / 1e9:>10,.1f} GB/s     {bw['method']} of "
            f"{bw['nbytes'] / 2**20:.0f} MiB, median of {bw['n']}, p90/p10 {bw.get('spread', 1.0):.2f}x")
    if entry is not None and entry.bytes_per_s:
        line += f" ({100 * bw['bytes_per_s'] / entry.bytes_per_s:.0f}% of the {entry.key} datasheet bandwidth)"
    console.print(line)
    if cal.disturbed is not None:
        import sys

        from lmprof.hardware.calibrate import load_calibration

        kept = load_calibration(cal.device_name, cal.device)
        print(f"lmprof: calibration refused, not saved and not used for MFU: the machine was disturbed "
              f"({cal.disturbed}); rerun `lmprof calibrate` on an idle machine"
              + (f" (the cached {kept.path} stays in use)" if kept else ""), file=sys.stderr)
        raise typer.Exit(1)
    if entry is None:
        console.print("  not in the peak table: MFU and rooflines on this device will use these measured figures")
    else:
        console.print(f"  in the peak table as {entry.key}: MFU uses the datasheet figures; these are for reference")
    if cal.path:
        console.print(f"saved {cal.path}")
    elif unsaved == "--no-save":
        console.print(f"not saved (--no-save); the cache is {cache_dir()}")
    else:
        console.print(f"not saved: {unsaved}")
