"""A CPU's peak FLOP/s estimated from what it says about itself: cores, clock and vector width.

Used when neither the peak table nor a calibration knows the CPU, so a CPU run still gets an MFU,
marked "estimated" with the figures it came from. The estimate is the textbook one:

    threads in use x clock x FLOP per cycle per core,
    FLOP per cycle = FMA units x vector lanes x 2 (a fused multiply-add is two FLOPs).

Lanes follow the widest vector instructions /proc/cpuinfo lists (AVX-512: 16 fp32 lanes, AVX2: 8,
SSE: 4); two FMA units per core (every x86 server core since Haswell / Zen); AMD cores before Zen 5
(family < 26) run AVX-512 on 256-bit units, so at AVX2's rate. The clock is cpufreq's maximum where
the kernel exposes it, else the "cpu MHz" of /proc/cpuinfo (the current clock: under a hypervisor
the nominal one, and boost clocks can exceed it, so a matmul may beat this estimate; lmprof then
shows MFU as n/a rather than above 100%). bf16 and fp16 get an estimate only where the CPU has
native instructions for them (AVX512_BF16 / AMX, AVX512_FP16); without them torch converts to fp32.
Memory bandwidth cannot be read off a CPU, so there is no estimate of it: a measured run measures it
on the fly instead (``quick_bandwidth.py``: a 0.25 s copy after the run's timed and profiled windows,
cached), and ``lmprof roofline`` / ``lmprof memory``, which measure nothing, read that or a calibration.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_CPUINFO = Path("/proc/cpuinfo")
_MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
FMA_UNITS = 2


@dataclass(frozen=True)
class CpuFacts:
    """What the estimate reads: the CPU's name, vendor, family, ISA flags and clock (GHz, where from)."""

    model: str
    vendor: str
    family: int | None
    flags: frozenset[str]
    ghz: float | None
    clock_source: str


def read_facts(cpuinfo: Path = _CPUINFO, max_freq: Path = _MAX_FREQ) -> CpuFacts | None:
    """This machine's CPU facts (Linux), None where /proc/cpuinfo cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    ghz, source = None, "unknown"
    try:
        ghz, source = int(max_freq.read_text().strip()) / 1e6, "cpufreq maximum"
    except (OSError, ValueError):
        try:
            ghz, source = float(fields.get("cpu MHz", "")) / 1e3, "cpu MHz in /proc/cpuinfo, the current clock"
        except ValueError:
            pass
    try:
        family: int | None = int(fields.get("cpu family", ""))
    except ValueError:
        family = None
    return CpuFacts(fields.get("model name", ""), fields.get("vendor_id", ""), family,
                    frozenset(fields.get("flags", "").split()), ghz if ghz and ghz > 0 else None, source)


def _fp32_lanes(facts: CpuFacts) -> tuple[int, str]:
    """fp32 lanes one FMA unit works on per cycle, and the instruction set that gives them."""
    if "avx512f" in facts.flags:
        if facts.vendor == "AuthenticAMD" and (facts.family or 0) < 26:
            return 8, "AVX-512 on 256-bit units"
        return 16, "AVX-512"
    if "avx2" in facts.flags and "fma" in facts.flags:
        return 8, "AVX2 + FMA"
    if "avx" in facts.flags:
        return 8 // 2, "AVX without FMA"  # separate multiply and add: half the FMA rate
    return 4 // 2, "SSE without FMA"


def estimate(facts: CpuFacts, threads: int, dtype: str) -> tuple[float | None, str]:
    """(FLOP/s or None, the sentence saying how it was derived or why there is none)."""
    if facts.ghz is None:
        return None, "no clock known for this CPU (no cpufreq maximum, no cpu MHz in /proc/cpuinfo)"
    lanes, isa = _fp32_lanes(facts)
    per_cycle = FMA_UNITS * lanes * 2
    if dtype == "fp64":
        per_cycle //= 2
    elif dtype == "bf16":
        if "amx_bf16" in facts.flags:
            per_cycle, isa = 1024, "AMX-BF16 tiles"
        elif "avx512_bf16" in facts.flags:
            per_cycle, isa = per_cycle * 2, isa + " with AVX512_BF16 dot products"
        else:
            return None, "no native bf16 instructions (avx512_bf16, amx_bf16): torch computes bf16 in fp32, no bf16 peak estimated"
    elif dtype == "fp16":
        if "avx512_fp16" not in facts.flags:
            return None, "no native fp16 instructions (avx512_fp16): no fp16 peak estimated"
        per_cycle *= 2
    elif dtype != "fp32":
        return None, f"no {dtype} estimate for CPUs"
    flops = threads * facts.ghz * 1e9 * per_cycle
    return flops, (f"estimated from {threads} thread(s) x {facts.ghz:.3g} GHz ({facts.clock_source}) x {per_cycle} "
                   f"{dtype} FLOP/cycle ({isa}: {FMA_UNITS} FMA units), not measured; `lmprof calibrate` measures one")
