"""The one place that decides which peak a figure uses: the datasheet table, a calibration, an estimate.

:func:`resolve_peak` answers "what is the peak of this device for this dtype": the datasheet table
when it knows the device, else the calibration cache (``hardware/calibration.py``), else (this
machine's CPU) an estimate from its cores and clock, else n/a with the reason. It never invents a
number. On CPU, a measured run with no cached bandwidth measures one on the fly
(``hardware/quick_bandwidth.py``).

A calibrated figure is what this software stack *achieves* on a large matmul, not what the silicon
could do, so MFU against it reads higher than MFU against a datasheet peak; the source string
always says which one was used.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmprof.dtypes import normalize_dtype
from lmprof.hardware import quick_bandwidth
from lmprof.hardware.calibration import Calibration, cache_dir, is_rate, load_calibration
from lmprof.hardware.peaks import PeakTable, load_table

#: How a bandwidth measured by a run's quick check (not by `lmprof calibrate`) is labelled.
ON_THE_FLY = "measured on the fly"


@dataclass(frozen=True)
class Peak:
    """The ceilings to compare a run against, and where they came from.

    ``source`` is ``"table:<entry>"``, ``"calibrated:<file>"``, ``"estimated:cpuinfo"`` or None (nothing
    known); when the bandwidth came from somewhere else than the FLOP/s, ``bytes_source`` says so (a
    quick check's starts with :data:`ON_THE_FLY`).
    """

    flops_per_s: float | None
    bytes_per_s: float | None
    source: str | None
    note: str
    dtype: str = "fp32"
    device: str = ""
    bytes_source: str | None = None

    @property
    def available(self) -> bool:
        return self.flops_per_s is not None

    @property
    def bandwidth_measured(self) -> bool:
        """Whether the bandwidth was measured on this machine (a calibration or a quick check), not a datasheet's."""
        return (self.bytes_source or self.source or "").startswith(("calibrated:", ON_THE_FLY))

    @property
    def ridge(self) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the compute and bandwidth ceilings meet."""
        if self.flops_per_s is None or not self.bytes_per_s:
            return None
        return self.flops_per_s / self.bytes_per_s


def resolve_peak(
    device_name: str,
    kind: str | None = None,
    dtype: object = "fp32",
    *,
    directory: str | Path | None = None,
    table: PeakTable | None = None,
    threads: int | None = None,
) -> Peak:
    """The peak FLOP/s (for ``dtype``) and bandwidth of a device: table, else calibration, else (this
    machine's CPU) an estimate from its cores, clock and vector width, else n/a.

    The bandwidth of this machine's CPU, when nothing is cached, is measured on the fly only inside
    :func:`lmprof.hardware.quick_bandwidth.allowed` (a measured run's figures, after its timed and
    profiled windows); everywhere else (``lmprof roofline``, ``lmprof memory``) nothing is measured.

    ``device_name`` is torch's name ("NVIDIA H100 80GB HBM3") or a short name ("h100"); ``kind`` is
    the torch device type (cpu, cuda, mps) or None for "any". A table entry lacking the dtype (bf16
    on a V100) falls back to a calibration of that dtype if there is one.
    """
    dt = normalize_dtype(dtype)
    table = table or load_table()
    entry = table.find(device_name, kind)
    flops = bw = None
    flops_src = bw_src = None
    notes: list[str] = []
    if entry is not None:
        flops = entry.flops_for(dt)
        bw = entry.bytes_per_s
        where = "" if entry.origin == "built-in" else f" from {entry.origin}"
        if flops is not None:
            flops_src = f"table:{entry.key}"
            notes.append(f"{entry.name} dense {dt} datasheet peak ({entry.source}){where}")
        else:
            notes.append(f"the peak table's {entry.name} has no {dt} rate")
        if bw is not None:
            bw_src = f"table:{entry.key}"
        if entry.note:
            notes.append(entry.note)
    if flops is None or bw is None:
        if threads is None and kind in ("cpu", None):
            import torch  # lazy, like the rest of this module: reading a peak needs no torch otherwise

            threads = torch.get_num_threads()  # a CPU ceiling holds for this process's thread count
        cal = load_calibration(device_name, kind, directory, notes, threads=threads)
        if cal is not None:
            if flops is None and cal.flops_for(dt) is not None:
                flops = cal.flops_for(dt)
                flops_src = f"calibrated:{cal.path}"
                m = cal.matmul[dt]
                notes.append(
                    f"achieved {dt} matmul throughput measured by lmprof calibrate on {cal.created[:10]} "
                    f"(n={m.get('size')}), not a datasheet peak"
                )
            if bw is None and cal.bytes_per_s is not None:
                bw = cal.bytes_per_s
                if cal.quick:
                    bw_src = on_the_fly_source(cal)
                    notes.append(f"bandwidth from a measured run's quick copy check on {cal.created[:10]}, cached in "
                                 f"{cal.path}")
                else:
                    bw_src = f"calibrated:{cal.path}"
                    notes.append("bandwidth measured by lmprof calibrate (copy, read + write counted)")
    this_cpu = False
    if flops is None and kind == "cpu":
        # Last resort for this machine's own CPU: cores x clock x vector width (hardware/cpu_peak.py).
        from lmprof.hardware import cpu_peak

        facts = cpu_peak.read_facts()
        if facts is not None and facts.model and facts.model == device_name:
            if threads is None:
                import torch

                threads = torch.get_num_threads()
            flops, how = cpu_peak.estimate(facts, threads, dt)
            flops_src = "estimated:cpuinfo" if flops else None
            notes.append(how)
            this_cpu = True
    if bw is None and kind == "cpu":
        # None outside a measured run's figures (lmprof roofline, lmprof memory): nothing is measured there.
        quick = quick_bandwidth.measure_if_allowed(device_name, threads, directory)
        if quick is not None:
            notes.append(quick.note)  # where the bandwidth was cached, or why there is none: said once
            if quick.calibration is not None:
                bw = quick.calibration.bytes_per_s
                bw_src = on_the_fly_source(quick.calibration)
        elif this_cpu:
            notes.append("no memory bandwidth known (it cannot be read off a CPU, and no calibration or quick check "
                         "of a measured run is cached): MBU and the roofline need `lmprof calibrate`")
    if flops is None and bw is None:
        what = f"{device_name!r}" + (f" ({kind})" if kind else "")
        reason = (
            f"no peak known for {what} {dt}: not in the peak table (version {table.version}) and no calibration "
            f"cached in {Path(directory or cache_dir())}; run `lmprof calibrate"
            + (f" --device {kind}" if kind else "")
            + f" --dtypes {dt}` or add the device to a user peaks.yaml"
        )
        return Peak(None, None, None, "; ".join(notes + [reason]) if notes else reason, dt, device_name)
    if flops is None:
        fix = ("add the figure to a user peaks.yaml" if dt == "fp8"
               else f"run `lmprof calibrate --dtypes {dt}` for a measured one")
        notes.append(f"no {dt} FLOP/s peak, so MFU is n/a: {fix}")
    source = flops_src if flops_src else None
    return Peak(
        flops_per_s=flops,
        bytes_per_s=bw,
        source=source,
        note="; ".join(notes),
        dtype=dt,
        device=device_name,
        bytes_source=bw_src if bw_src != flops_src else None,
    )


def on_the_fly_source(cal: Calibration) -> str:
    """The bandwidth source of a quick check: what was measured, how steady, and what it is not."""
    bw = cal.bandwidth
    nbytes = bw.get("nbytes")
    size = f"{nbytes / 2**20:.0f} MiB" if isinstance(nbytes, (int, float)) and nbytes >= 2**20 else f"{nbytes} bytes"
    spr = bw.get("spread")
    steady = f", p90/p10 spread {100 * (spr - 1):.0f}% over {bw.get('n')} copies" if spr and is_rate(spr) else ""
    disturbed = (f"; DISTURBED, so for this run only and not cached: {cal.disturbed} (the copies competed, so "
                 "the bandwidth is understated and MBU overstated)" if cal.disturbed else "")
    return (f"{ON_THE_FLY} (quick bandwidth check, {size} copied{steady}), not a datasheet figure{disturbed}; "
            "`lmprof calibrate` for a full one")
