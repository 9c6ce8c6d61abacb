"""MFU / HFU metrics and per-block FLOPs, bytes and roofline points for a run.

The lead's run builder calls three things:

* :func:`mfu_metrics`: model FLOPs of a step (or phase), achieved FLOP/s, the device peak and its
  source, MFU, HFU and memory-bandwidth utilisation, as run-record :class:`Metric` s;
* :func:`fill_block_costs`: copies of the run's :class:`Block` s with ``flops`` and ``bytes`` set;
* :func:`block_roofline` / :func:`run_roofline_png`: roofline points and the PNG from measured times.

MFU (PaLM appendix B) = model FLOPs per second / peak FLOP/s, where model FLOPs are what the model
mathematically needs (6N + 12·L·d·T per training token). HFU counts the FLOPs the hardware actually
executes, which adds activation recomputation; lmprof does not recompute by default, so HFU == MFU
unless ``recompute`` says otherwise.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

from lmprof.dtypes import normalize_dtype
from lmprof.estimate.flops import (
    DEFAULT_CONVENTIONS,
    BlockCost,
    FlopConventions,
    model_flops_per_step,
    model_flops_per_token,
    phase_costs,
    totals,
)
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.roofline import DEFAULT_OVERHEAD_THRESHOLD, RooflinePoint, classify
from lmprof.errors import ConfigError
from lmprof.names import PASS_PHASES
from lmprof.units import si
from lmprof.record.catalogue import (
    BYTES_MODEL, FLOPS_ACHIEVED, FLOPS_HARDWARE, FLOPS_MODEL, HFU, MBU, MFU, PEAK_BANDWIDTH, PEAK_FLOPS,
)
from lmprof.record.run import Block, Metric, Source
from lmprof.estimate.shape import ModelShape

if TYPE_CHECKING:
    from lmprof.hardware.calibrate import Peak

# The pass a figure is for: a training step (forward + backward), a prefill, the decode steps (names.PASS_PHASES).
Pass = Literal["train", "prefill", "decode"]
#: A utilisation (MFU, HFU, MBU) above this is never given as a figure: the peak it divides by is wrong.
MAX_UTILISATION_PCT = 100.0
Recompute = Literal["none", "full"] | float | None
# Phase names a run may use for its blocks, mapped to the analytic phases.
DEFAULT_PHASE_MAP: dict[str, str] = {
    "forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
    "prefill": "prefill", "decode": "decode",
}


def _recompute_fraction(recompute: Recompute) -> float:
    if recompute in (None, "none"):
        return 0.0
    if recompute == "full":
        return 1.0
    if isinstance(recompute, (int, float)) and 0.0 <= float(recompute) <= 1.0:
        return float(recompute)
    raise ConfigError(f"recompute must be 'none', 'full' or a fraction in [0, 1], got {recompute!r}")


def _resolved(peak: object | None, device_name: str, device_kind: str | None, dtype: str,
              cache_dir: str | Path | None = None) -> Peak:
    """``peak`` as given, else the device's peak for ``dtype`` (hardware/calibrate.py)."""
    from lmprof.hardware.calibrate import Peak, resolve_peak

    if peak is None:
        peak = resolve_peak(device_name, device_kind, dtype, directory=cache_dir)
    assert isinstance(peak, Peak)
    return peak


def per_pass(mode: Pass, decode_steps: int) -> str:
    """What one figure of ``mode`` covers, in its notes."""
    return {"train": "training step", "prefill": "prefill", "decode": f"{decode_steps} decode step(s)"}[mode]


def peak_flops_metric(peak: Peak) -> Metric:
    """The device's peak FLOP/s as a run metric: measured when calibrated here, else estimated; n/a with why."""
    if not peak.flops_per_s:
        return Metric.na("FLOP/s", peak.note, source="estimated")
    calibrated = (peak.source or "").startswith("calibrated:")
    return Metric(value=peak.flops_per_s, unit="FLOP/s", source="measured" if calibrated else "estimated",
                  note=f"{peak.source}: {peak.note}")


def mfu_metrics(
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    mode: Pass,
    time_s: float | None,
    device_name: str,
    device_kind: str | None = None,
    dtype: object = "bf16",
    decode_tokens: int = 1,
    recompute: Recompute = None,
    tf32: bool = False,
    attention: Literal["math", "sdpa"] = "math",
    conventions: FlopConventions = DEFAULT_CONVENTIONS,
    peak: object | None = None,
    cache_dir: str | Path | None = None,
    kv_cache: bool = True,
    recomputed: tuple[float | None, str] | None = None,
    recomputed_source: Source = "estimated",
) -> dict[str, Metric]:
    """Model FLOPs, achieved FLOP/s, peak, MFU, HFU and bandwidth utilisation of one step or phase.

    ``mode``: ``train`` (one optimizer step, forward + backward, ``time_s`` its step time),
    ``prefill`` (``seq_len`` prompt tokens) or ``decode`` (``decode_tokens`` steps after a
    ``seq_len`` prompt, ``time_s`` the time of all of them). ``recompute`` (train only): ``"full"``
    activation checkpointing adds one forward per step to the hardware FLOPs, a float adds that
    fraction of a forward; None means lmprof's default, no recomputation, so HFU == MFU.
    ``kv_cache=False`` (decode): each decode step re-runs the whole sequence; the model FLOPs stay the
    new tokens' work (what a cached step does), the hardware FLOPs are the recomputation
    (:func:`recomputed_decode_flops`), so MFU shows what the missing cache costs and HFU what ran.
    ``recomputed`` (train): the hardware FLOPs of a step that recomputed, as counted, and their note
    (None FLOPs: not known, so they and HFU are n/a with that note), ``recomputed_source`` how they were
    had; it replaces ``recompute``'s model.
    ``tf32`` with fp32 compares against the TF32 tensor-core peak (what cuBLAS uses when TF32 is on).
    ``peak`` may be a resolved :class:`~lmprof.hardware.calibrate.Peak`; by default it is resolved.

    Keys: ``flops.model_per_step`` (FLOP), ``flops.hardware_per_step`` (FLOP), ``flops.achieved``
    (FLOP/s), ``peak.flops`` (FLOP/s), ``peak.bandwidth`` (B/s), ``bytes.model_per_step`` (B),
    ``mfu`` (%), ``hfu`` (%), ``mbu`` (%: minimum bytes / time / peak bandwidth).
    """
    if mode not in PASS_PHASES:
        raise ConfigError(f"mode must be one of the passes {', '.join(PASS_PHASES)}, got {mode!r}")
    dt = normalize_dtype(dtype)
    peak_dtype = "tf32" if (tf32 and dt == "fp32") else dt
    fraction = _recompute_fraction(recompute)
    if fraction and mode != "train":
        raise ConfigError("recompute only applies to training")

    model = model_flops_per_step(
        shape, batch=batch, seq_len=seq_len, mode=mode, decode_tokens=decode_tokens, conventions=conventions
    )
    # What full recomputation adds per training step: one forward pass (fraction is 0 but in training).
    forward = batch * seq_len * model_flops_per_token(shape, seq_len, "forward", conventions) if fraction else 0.0
    hardware = model + fraction * forward
    hardware_note = ("model FLOPs, no recomputation" if not fraction
                     else f"model FLOPs + {fraction:g} x forward recomputed (activation checkpointing)")
    if mode == "decode" and not kv_cache:
        hardware = recomputed_decode_flops(shape, batch=batch, seq_len=seq_len, decode_tokens=decode_tokens,
                                           conventions=conventions)
        hardware_note = recomputed_note(decode_tokens, "B·T'·(2N + 4·L·d·T') each, summed")
    hw: float | None = hardware
    hw_source: Source = "estimated"
    if mode == "train" and recomputed is not None:
        (hw, hardware_note), hw_source = recomputed, recomputed_source
    nbytes = totals(
        phase_costs(shape, batch=batch, seq_len=seq_len, phase=mode, dtype=dt, decode_tokens=decode_tokens,
                    attention=attention, conventions=conventions)
    )["bytes"]

    per = per_pass(mode, decode_tokens)
    last_only = " minus lm_head of all but the last position" if conventions.prefill_logits == "last" else ""
    formula = {
        # N is the one the value uses: a mixture of experts counts the experts a token runs (top_k), not all.
        "train": f"B·T·(6N + 12·L·d·T), N={shape.n_params_non_embedding(active=True):,} non-embedding params"
                 + (f" active per token (top-{shape.top_k} of {shape.n_experts} experts)" if shape.moe else ""),
        "prefill": f"B·T·(2N + 4·L·d·T){last_only}",
        "decode": "sum over steps of B·(2N + 4·L·d·context)",
    }[mode]
    peak = _resolved(peak, device_name, device_kind, peak_dtype, cache_dir)
    return utilisation_metrics(
        model, hw, nbytes, time_s, peak, peak_dtype,
        model_note=f"model FLOPs per {per}: {formula}; B={batch}, T={seq_len}",
        hardware_note=hardware_note, bytes_note=f"minimum bytes moved per {per} at {dt} width (sum over blocks)",
        recomputed=hw != model, hardware_source=hw_source)


Cost = Callable[[tuple[int, ...]], tuple[float, float]]  # one forward's (batch, sequence[, decode steps]) -> FLOPs, bytes


def formula_cost(shape: ModelShape, mode: Pass, *, dtype: object = "bf16", attention: Literal["math", "sdpa"] = "math",
                 conventions: FlopConventions = DEFAULT_CONVENTIONS) -> Cost:
    """One forward's model FLOPs and minimum bytes by lmprof's formulas, for :func:`varied_mfu_metrics`."""
    dt = normalize_dtype(dtype)

    def cost(f: tuple[int, ...]) -> tuple[float, float]:
        b, t, d = f[0], f[1], f[2] if len(f) > 2 else 1
        flops = model_flops_per_step(shape, batch=b, seq_len=t, mode=mode, decode_tokens=d, conventions=conventions)
        nbytes = totals(phase_costs(shape, batch=b, seq_len=t, phase=mode, dtype=dt, decode_tokens=d,
                                    attention=attention, conventions=conventions))["bytes"]
        return flops, nbytes

    return cost


def varied_mfu_metrics(steps: Sequence[tuple[float, Sequence[tuple[int, ...]]]], cost: Cost, *, how: str,
                       device_name: str, device_kind: str | None = None, dtype: object = "bf16", mode: Pass = "train",
                       hardware: tuple[float | None, str] | None = None, peak: object | None = None,
                       ) -> dict[str, Metric]:
    """:func:`mfu_metrics` of steps that ran different shapes: ``steps`` holds each step's time (seconds)
    and the (batch, sequence) of each of its forwards (a training step's micro-batches; a generation's
    prompt, with its decode steps as a third number for ``mode="decode"``); ``cost`` gives one forward's
    FLOPs and bytes (:func:`formula_cost`, or a model read off the meta device at each shape), ``how``
    says how. Each step's FLOPs and bytes are its own forwards'; the figures are the steps' means, so the
    rates are their totals over their total time (MFU = sum of FLOPs / sum of time / peak). ``hardware``:
    the hardware FLOPs per step and their note where they are not the model FLOPs (None FLOPs: n/a)."""
    dt = normalize_dtype(dtype)
    flops, nbytes = [], []
    for _, forwards in steps:
        each = [cost(tuple(f)) for f in forwards]
        flops.append(sum(c[0] for c in each))
        nbytes.append(sum(c[1] for c in each))
    n = len(steps)
    model = sum(flops) / n
    seen = sorted({f"{f[0]}x{f[1]}" for _, forwards in steps for f in forwards},
                  key=lambda s: [int(x) for x in s.split("x")])
    shapes = ", ".join(seen[:6]) + (f" ... ({len(seen)} shapes)" if len(seen) > 6 else "")
    unit = {"train": "training step", "prefill": "prefill", "decode": "generation's decode steps"}[mode]
    steps_are = "clean steps" if mode == "train" else "clean generations"
    hw, hw_note = hardware if hardware is not None else (model, "model FLOPs, no recomputation")
    return utilisation_metrics(
        model, hw, sum(nbytes) / n, sum(t for t, _ in steps) / n, _resolved(peak, device_name, device_kind, dt), dt,
        model_note=f"model FLOPs per {unit}, the mean of the {n} {steps_are}, each {how} at the shapes it ran "
                   f"(B x T: {shapes})",
        hardware_note=hw_note, bytes_note=f"bytes moved per {unit} at {dt} width, the mean of the {steps_are}' own",
        recomputed=hw != model)


def recomputed_decode_flops(shape: ModelShape, *, batch: int, seq_len: int, decode_tokens: int,
                            conventions: FlopConventions = DEFAULT_CONVENTIONS) -> float:
    """FLOPs of ``decode_tokens`` decode steps without a KV cache after a ``seq_len``-token prompt: step
    k runs the model over the whole sequence so far, a forward of ``seq_len + k`` tokens (a prefill)."""
    return float(sum(model_flops_per_step(shape, batch=batch, seq_len=seq_len + k, mode="prefill",
                                          conventions=conventions) for k in range(1, decode_tokens + 1)))


def recomputed_note(decode_tokens: int, how: str) -> str:
    """The hardware FLOPs' note of decode without a KV cache (``how``: where the figure comes from)."""
    return (f"no KV cache: each of the {decode_tokens} decode step(s) re-runs the whole sequence, a forward over "
            f"T+1 ... T+{decode_tokens} tokens ({how})")


def facts_mfu_metrics(facts: ModelFacts, *, mode: Pass, time_s: float | None, device_name: str,
                      device_kind: str | None = None, dtype: object = "bf16", decode_steps: int = 1,
                      peak: object | None = None, recomputed: tuple[float | None, str] | None = None,
                      recomputed_source: Source = "estimated") -> dict[str, Metric]:
    """:func:`mfu_metrics` for a model the describer read (:class:`~lmprof.estimate.facts.ModelFacts`):
    FLOPs and bytes of its blocks as the model runs them; ``decode_steps`` steps of the decode it read.

    ``recomputed`` (decode without a KV cache, or a training step that recomputed checkpointed
    activations): the hardware FLOPs of the recomputing steps and their note (None FLOPs: not known, so
    HFU is n/a with that note); the describer reads a cached step of a model that recomputes nothing."""
    dt = normalize_dtype(dtype)
    rows = [r for r in facts.rows if r.phase in PASS_PHASES[mode]]
    per = per_pass(mode, decode_steps)
    scale = decode_steps if mode == "decode" else 1
    flops = scale * sum(r.flops for r in rows)
    nbytes = scale * sum(r.bytes for r in rows)
    peak = _resolved(peak, device_name, device_kind, dt)
    step = (f"one step at KV length {facts.context} x {decode_steps}" if mode == "decode" else
            f"B={facts.batch}, T={facts.seq_len}")
    hardware: float | None = flops
    hardware_note = "the model's FLOPs as it runs them, no recomputation"
    hw_source: Source = "estimated"
    if mode in ("decode", "train") and recomputed is not None:
        (hardware, hardware_note), hw_source = recomputed, recomputed_source
    return utilisation_metrics(
        flops, hardware, nbytes, time_s, peak, dt,
        model_note=f"FLOPs per {per} read off the model on the meta device (torch's FlopCounterMode formulas over "
                   f"its ops); {step}",
        hardware_note=hardware_note,
        bytes_note=f"bytes its ops read and write per {per} (one kernel per op), read off the model",
        recomputed=hardware != flops, hardware_source=hw_source)


def utilisation_metrics(model: float, hardware: float | None, nbytes: float, time_s: float | None, peak: Peak,
                        peak_dtype: str, *, model_note: str, hardware_note: str, bytes_note: str,
                        recomputed: bool, hardware_source: Source = "estimated") -> dict[str, Metric]:
    """The metrics of :func:`mfu_metrics` from model / hardware FLOPs and bytes of one step and its time
    (``hardware`` None: not known, so it and HFU are n/a with ``hardware_note``; ``hardware_source``:
    ``measured`` where FlopCounterMode counted them on a real step)."""
    out: dict[str, Metric] = {
        FLOPS_MODEL: Metric(value=model, unit="FLOP", source="estimated", note=model_note),
        FLOPS_HARDWARE: (Metric(value=hardware, unit="FLOP", source=hardware_source, note=hardware_note)
                         if hardware is not None else Metric.na("FLOP", hardware_note, source=hardware_source)),
        BYTES_MODEL: Metric(value=nbytes, unit="B", source="estimated", note=bytes_note),
    }
    timed = time_s is not None and time_s > 0
    out[FLOPS_ACHIEVED] = (
        Metric(value=model / time_s if time_s else None, unit="FLOP/s", source="derived", note="model FLOPs / measured time")
        if timed else Metric.na("FLOP/s", "no measured time", source="derived")
    )
    out[PEAK_FLOPS] = peak_flops_metric(peak)
    if peak.bytes_per_s:
        bw_src = peak.bytes_source or peak.source
        out[PEAK_BANDWIDTH] = Metric(
            value=peak.bytes_per_s, unit="B/s",
            source="measured" if peak.bandwidth_measured else "estimated", note=str(bw_src),
        )
    else:
        out[PEAK_BANDWIDTH] = Metric.na("B/s", peak.note, source="estimated")

    flops_peak = f"peak {peak_dtype} FLOP/s ({si(peak.flops_per_s, sep='')}, {peak.source})" if peak.flops_per_s else ""
    bw_peak = (f"peak bandwidth ({si(peak.bytes_per_s, sep='')}B/s, {peak.bytes_source or peak.source})"
               if peak.bytes_per_s else "")

    def pct(key: str, num: float, denom: float | None, what: str, of: str) -> None:
        if not timed or not time_s:
            out[key] = Metric.na("%", "no measured time", source="derived")
        elif not denom:
            out[key] = Metric.na("%", peak.note, source="derived")
        elif 100.0 * num / time_s / denom > MAX_UTILISATION_PCT:
            # Above the ceiling: the ceiling is wrong (a calibration on a busy machine, a wrong table
            # entry), so the figure would be nonsense, not a measurement.
            out[key] = Metric.na("%", f"{what} / {of} would be {100.0 * num / time_s / denom:.0f}%, above 100%: "
                                 "the peak is below what this device achieved, so it is not a ceiling "
                                 "(rerun `lmprof calibrate` on an idle machine, or fix the peak table)", source="derived")
        else:
            out[key] = Metric(value=100.0 * num / time_s / denom, unit="%", source="derived", note=f"{what} / {of}")

    pct(MFU, model, peak.flops_per_s, "model FLOP/s", flops_peak)
    if hardware is None:
        out[HFU] = Metric.na("%", hardware_note, source="derived")
    else:
        pct(HFU, hardware, peak.flops_per_s,
            "hardware FLOP/s (with recomputation)" if recomputed else "hardware FLOP/s (no recomputation: HFU == MFU)",
            flops_peak)
    pct(MBU, nbytes, peak.bytes_per_s, "minimum bytes/s", bw_peak)
    return out


def fill_block_costs(blocks: Sequence[Block], costs: Callable[[str], Sequence[BlockCost]], *,
                     phase_map: Mapping[str, str] = DEFAULT_PHASE_MAP) -> list[Block]:
    """Copies of ``blocks`` with ``flops`` and ``bytes`` set from the analytic model.

    ``costs(phase)`` gives a phase's block costs (:func:`~lmprof.estimate.flops.phase_costs` at the run's
    shape, batch, dtype, ...), asked once per phase. A block's phase is mapped through ``phase_map``
    (forward/backward/prefill/decode); blocks of other phases (optimizer, data, ...) or unknown names are
    returned unchanged. Decode costs are a phase total when ``phase_costs`` sums ``decode_tokens`` steps.
    """
    cache: dict[str, dict[str, tuple[float, float]]] = {}

    def cost(name: str, phase: str) -> tuple[float, float] | None:
        if phase not in cache:
            cache[phase] = {c.name: (c.flops, c.bytes) for c in costs(phase)}
        return cache[phase].get(name)

    return _filled(blocks, cost, phase_map)


def fill_facts_block_costs(blocks: Sequence[Block], facts: ModelFacts, *, decode_steps: int = 1,
                           phase_map: Mapping[str, str] = DEFAULT_PHASE_MAP) -> list[Block]:
    """:func:`fill_block_costs` from the describer's rows (a decode block: ``decode_steps`` steps of the one read)."""
    rows = {(r.name, r.phase): r for r in facts.rows}

    def cost(name: str, phase: str) -> tuple[float, float] | None:
        r = rows.get((name, phase))
        scale = decode_steps if phase == "decode" else 1
        return None if r is None else (r.flops * scale, r.bytes * scale)

    return _filled(blocks, cost, phase_map)


def _filled(blocks: Sequence[Block], cost: Callable[[str, str], tuple[float, float] | None],
            phase_map: Mapping[str, str]) -> list[Block]:
    """``blocks`` with the (FLOPs, bytes) ``cost(name, phase)`` gives each in its mapped phase; the others as
    they are."""
    out = []
    for b in blocks:
        phase = phase_map.get(b.phase)
        fb = cost(b.name, phase) if phase is not None else None
        out.append(b if fb is None else b.model_copy(update={"flops": fb[0], "bytes": fb[1]}))
    return out


def block_roofline(
    blocks: Sequence[Block],
    peak_flops: float | None,
    peak_bytes_per_s: float | None,
    *,
    overhead_threshold: float = DEFAULT_OVERHEAD_THRESHOLD,
    use_profiled: bool = False,
) -> list[RooflinePoint]:
    """Roofline points of blocks with ``flops`` and ``bytes`` set, from their measured time.

    ``time_ms`` (the clean, profiler-free share) is used unless ``use_profiled``.
    """
    points = []
    for b in blocks:
        if b.flops is None or b.bytes is None:
            continue
        t_ms = b.profiled_ms if use_profiled else b.time_ms
        points.append(classify(b.name, b.flops, b.bytes, peak_flops, peak_bytes_per_s,
                               time_s=t_ms / 1e3 if t_ms else None, phase=b.phase,
                               overhead_threshold=overhead_threshold))
    return points


__all__ = ["mfu_metrics", "facts_mfu_metrics", "fill_block_costs", "fill_facts_block_costs", "block_roofline",
           "utilisation_metrics", "DEFAULT_PHASE_MAP"]
