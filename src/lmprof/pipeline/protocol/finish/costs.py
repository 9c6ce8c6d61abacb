"""Attach FLOP and byte counts, MFU and the roofline to a finished run.

Analytic counts need the model's shape (the built-in GPT, or any Hugging Face family that
:func:`lmprof.estimate.models.shape_from_config` describes); a module lmprof cannot describe gets a
note instead of invented numbers.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from lmprof.estimate.flops import conventions_for, phase_costs
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.mfu import (Pass, block_roofline, facts_mfu_metrics, fill_block_costs, fill_facts_block_costs,
                                 formula_cost, mfu_metrics, recomputed_note, varied_mfu_metrics)
from lmprof.estimate.roofline import DEFAULT_OVERHEAD_THRESHOLD
from lmprof.modes import traits
from lmprof.names import MATMUL_BLOCKS, PASS_PHASES
from lmprof.record.catalogue import (BYTES_MODEL, DECODE_TOKENS_PER_S, FLOPS_ACHIEVED, FLOPS_HARDWARE, FLOPS_MODEL,
                                     HFU, MBU, MFU, STEP_TIME, TPOT, TTFT, cost_key)
from lmprof.record.run import Block, Metric, Run
from lmprof.estimate.shape import ModelShape



def add_costs(
    run: Run,
    folder: Path,
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    dtype: str,
    attention: Literal["math", "sdpa"] = "math",
    decode_tokens: int = 1,
    plots: bool = True,
    kv_cache: bool = True,
    last_logits_only: bool | None = None,
    recomputed_step: tuple[float | None, str] | None = None,
    micro_batches: float = 1.0,
    no_bytes: str | None = None,
) -> None:
    """Fill block FLOPs/bytes, MFU figures, the roofline table and (with ``plots``) roofline.png
    (``kv_cache=False``: decode re-ran the whole sequence each step, :func:`no_cache_note`;
    ``last_logits_only``: what the prefills were seen to compute, else the model's convention;
    ``recomputed_step``: a training step that recomputed checkpointed activations, its hardware FLOPs
    as counted and their note; ``micro_batches``: batches of ``batch`` x ``seq_len`` per optimizer step,
    gradient accumulation's, :func:`per_optimizer_step`; ``no_bytes``: why the formulas' bytes are not the
    run's, as for :func:`add_model_costs`)."""

    kind = run.env.device.split(":")[0]
    # Hugging Face models compute logits at every prompt position, the built-in GPT at the last one;
    # generate() asks a model that takes logits_to_keep for the last one only, as its output shows.
    conventions = conventions_for(shape)
    if last_logits_only is not None:
        conventions = replace(conventions, prefill_logits="last" if last_logits_only else "all")

    for p in passes(run):
        trains = p == "train"  # the training pass: micro-batches and the backward's recomputation are its
        k = micro_batches if trains else 1.0
        figures = mfu_metrics(shape, batch=batch, seq_len=seq_len, mode=p,
                              time_s=_per_batch(pass_time_s(run, p, batch, decode_tokens), k),
                              decode_tokens=max(decode_tokens, 1), device_name=run.env.device_name, device_kind=kind,
                              dtype=dtype, attention=attention, conventions=conventions, kv_cache=kv_cache,
                              recomputed=_recomputed_per_batch(recomputed_step, k) if trains else None,
                              recomputed_source="measured")
        figures = per_optimizer_step(_without_bytes(figures, no_bytes), k)
        if p == "decode" and not decode_tokens:  # generate(max_new_tokens=1): the prefill is all there is
            figures = {k: Metric.na(v.unit, "no decode step: each generation was its prefill only", v.source)
                       for k, v in figures.items()}
        put_pass(run, p, figures)
    # decode_tokens scales the decode blocks, of which a prefill-only generation has none
    run.blocks = _blocks_per_step(fill_block_costs(run.blocks, lambda phase: phase_costs(
        shape, batch=batch, seq_len=seq_len, phase=phase, dtype=dtype, decode_tokens=max(decode_tokens, 1),
        attention=attention, conventions=conventions)), micro_batches)
    run.blocks = _blocks_without_bytes(run.blocks, no_bytes)
    no_cache_note(run, kv_cache, decode_tokens)
    _roofline(run, folder, dtype, shape.name or "model", plots)


def add_model_costs(run: Run, folder: Path, facts: ModelFacts, *, dtype: str, decode_tokens: int = 1,
                    plots: bool = True, kv_cache: bool = True, counted_decode: tuple[int, str] | None = None,
                    recomputed_step: tuple[float | None, str] | None = None, micro_batches: float = 1.0,
                    no_bytes: str | None = None) -> None:
    """:func:`add_costs` for a model the describer read (a family lmprof has no formulas for).

    The describer reads a cached decode step; without a KV cache the hardware FLOPs of decode are
    FlopCounterMode's count of a whole generation's decode steps (``counted_decode``: the count and
    where it was taken), or n/a when none was counted. ``recomputed_step``, ``micro_batches``: as for
    :func:`add_costs`. ``no_bytes``: why the bytes it read are not the run's (bytes, MBU and the
    roofline n/a)."""
    kind = run.env.device.split(":")[0]
    recomputed: tuple[float | None, str] | None = None
    if not kv_cache and counted_decode:
        count, where = counted_decode
        recomputed = (float(count), recomputed_note(decode_tokens, f"FlopCounterMode's count on {where}"))
    elif not kv_cache:
        recomputed = (None, recomputed_note(decode_tokens, "not counted in this run: its FLOPs are n/a"))
    for p in passes(run):
        trains = p == "train"
        k = micro_batches if trains else 1.0
        figures = facts_mfu_metrics(facts, mode=p, time_s=_per_batch(pass_time_s(run, p, facts.batch, decode_tokens), k),
                                    device_name=run.env.device_name, device_kind=kind, dtype=dtype,
                                    decode_steps=max(decode_tokens, 1),
                                    recomputed=_recomputed_per_batch(recomputed_step, k) if trains else recomputed,
                                    recomputed_source="measured" if trains or counted_decode else "estimated")
        put_pass(run, p, per_optimizer_step(_without_bytes(figures, no_bytes), k))
    run.blocks = _blocks_per_step(fill_facts_block_costs(run.blocks, facts, decode_steps=max(decode_tokens, 1)),
                                  micro_batches)
    run.blocks = _blocks_without_bytes(run.blocks, no_bytes)
    run.notes.append(f"FLOPs, bytes and block costs read off the model on the meta device ({facts.family!r} has no "
                     "lmprof formulas): torch's FlopCounterMode formulas over the ops it runs"
                     + (f"; decode: one step at KV length {facts.context} times the steps"
                        if traits(run.mode).generates else ""))
    no_cache_note(run, kv_cache, decode_tokens)
    _roofline(run, folder, dtype, facts.name or "model", plots)


def add_varied_costs(run: Run, folder: Path, shape: ModelShape,
                     steps: Mapping[str, Sequence[tuple[float, Sequence[tuple[int, ...]]]]],
                     blocks_from: Sequence[Sequence[tuple[int, ...]]], *, dtype: str,
                     attention: Literal["math", "sdpa"] = "math", plots: bool = True,
                     recomputed_step: tuple[float | None, str] | None = None,
                     last_logits_only: bool | None = None, note: str, no_bytes: str | None = None) -> None:
    """:func:`add_costs` for steps that ran different shapes. ``steps``: per pass, each step's seconds and its
    forwards' (batch, sequence[, decode steps]); each step's FLOPs are its own, MFU their sum over the steps'
    time. ``blocks_from``: the shapes the blocks' FLOPs are the mean of (the profiled training steps', the
    clean generations'). ``note``: what the run says of it; ``no_bytes`` as for :func:`add_model_costs`."""
    kind = run.env.device.split(":")[0]
    conventions = conventions_for(shape)
    if last_logits_only is not None:
        conventions = replace(conventions, prefill_logits="last" if last_logits_only else "all")
    hardware = None if recomputed_step is None else _VARIED_RECOMPUTED
    for p, each in steps.items():
        if not each:
            put_pass(run, p, {k: Metric.na(u, "no decode step: each generation was its prefill only", source="derived")
                              for k, u in _NA_UNITS})
            continue
        put_pass(run, p, _without_bytes(varied_mfu_metrics(
            each, formula_cost(shape, p, dtype=dtype, attention=attention,  # type: ignore[arg-type]  # a pass name
                               conventions=conventions),
            how="by lmprof's formulas", mode=p,  # type: ignore[arg-type]
            device_name=run.env.device_name, device_kind=kind, dtype=dtype,
            hardware=hardware if p == "train" else None), no_bytes))
    run.blocks = _blocks_without_bytes(_mean_blocks(run.blocks, blocks_from, lambda f: fill_block_costs(
        run.blocks, lambda phase: phase_costs(shape, batch=f[0], seq_len=f[1], phase=phase, dtype=dtype,
                                              decode_tokens=max(f[2], 1) if len(f) > 2 else 1, attention=attention,
                                              conventions=conventions))), no_bytes)
    run.notes.append(note)
    _roofline(run, folder, dtype, shape.name or "model", plots)


def add_varied_model_costs(run: Run, folder: Path, facts: Mapping[tuple[int, int], ModelFacts],
                           clean: Sequence[tuple[float, Sequence[tuple[int, ...]]]],
                           profiled: Sequence[Sequence[tuple[int, ...]]], *, dtype: str, plots: bool = True,
                           recomputed_step: tuple[float | None, str] | None = None, note: str,
                           no_bytes: str | None = None) -> None:
    """:func:`add_varied_costs` of training steps for a model the describer read once at each shape the steps
    ran (``facts``: by (batch, sequence)); ``no_bytes`` as for :func:`add_model_costs`."""
    def cost(f: tuple[int, ...]) -> tuple[float, float]:
        one = facts[(f[0], f[1])]
        return one.flops("train"), float(sum(r.bytes for r in one.rows if r.phase in PASS_PHASES["train"]))

    hardware = None if recomputed_step is None else _VARIED_RECOMPUTED
    kind = run.env.device.split(":")[0]
    put_pass(run, "train", _without_bytes(varied_mfu_metrics(clean, cost, how="read off the model on the meta device",
                                                             device_name=run.env.device_name, device_kind=kind,
                                                             dtype=dtype, hardware=hardware), no_bytes))
    run.blocks = _mean_blocks(run.blocks, profiled, lambda f: fill_facts_block_costs(run.blocks, facts[(f[0], f[1])]))
    run.blocks = _blocks_without_bytes(run.blocks, no_bytes)
    run.notes.append(note)
    _roofline(run, folder, dtype, next(iter(facts.values())).name or "model", plots)


# The hardware FLOPs of a step that ran more than the model's (checkpointing, other models) are counted on
# one step: steps of other shapes have none.
_VARIED_RECOMPUTED: tuple[float | None, str] = (
    None, "the step ran more than the model's FLOPs (recomputed activations, other models), counted on one step "
          "whose shape the clean steps did not all have: hardware FLOPs are n/a")


def _mean_blocks(blocks: list[Block], runs: Sequence[Sequence[tuple[int, ...]]],
                 fill: Callable[[tuple[int, ...]], list[Block]]) -> list[Block]:
    """Blocks whose FLOPs and bytes are the mean over ``runs`` (each a step's forwards) of the forwards'
    sums, ``fill`` giving the blocks' costs of one forward; unchanged where no step is known."""
    steps = [forwards for forwards in runs if forwards]
    if not steps:
        return blocks
    sums: dict[tuple[str, str], list[float]] = {}
    for forwards in steps:
        for f in forwards:
            for blk in fill(tuple(f)):
                if blk.flops is not None:
                    acc = sums.setdefault((blk.name, blk.phase), [0.0, 0.0])
                    acc[0] += blk.flops
                    acc[1] += blk.bytes or 0.0
    n = len(steps)
    return [b.model_copy(update={"flops": sums[(b.name, b.phase)][0] / n, "bytes": sums[(b.name, b.phase)][1] / n})
            if (b.name, b.phase) in sums else b for b in blocks]


_NA_UNITS = ((FLOPS_MODEL, "FLOP"), (FLOPS_HARDWARE, "FLOP"), (BYTES_MODEL, "B"), (FLOPS_ACHIEVED, "FLOP/s"),
             (MFU, "%"), (HFU, "%"), (MBU, "%"))


def _without_bytes(figures: dict[str, Metric], why: str | None) -> dict[str, Metric]:
    """``figures`` with the bytes and MBU n/a (``why``), where the bytes read are not the run's."""
    if not why:
        return figures
    return {**figures, BYTES_MODEL: Metric.na("B", why, source="estimated"), MBU: Metric.na("%", why, source="derived")}


def _blocks_without_bytes(blocks: list[Block], why: str | None) -> list[Block]:
    """``blocks`` with no bytes (so no roofline point), where the bytes read are not the run's (``why``)."""
    return [b.model_copy(update={"bytes": None}) for b in blocks] if why else blocks


def compute_na(run: Run, why: str, only: Pass | None = None) -> None:
    """The compute figures of every pass (or ``only`` that one) n/a (``why``): nothing here gives the
    steps their own FLOPs (they ran different shapes; a prefill ran part of its prompt)."""
    for p in passes(run):
        if only is None or p == only:
            put_pass(run, p, {key: Metric.na(unit, why, source="derived" if unit in ("%", "FLOP/s") else "estimated")
                              for key, unit in _NA_UNITS})


def per_optimizer_step(figures: dict[str, Metric], k: float) -> dict[str, Metric]:
    """One micro-batch's figures (its FLOPs and bytes; rates over the step's time / ``k``) as the optimizer
    step's: its totals times ``k``, the micro-batches of gradient accumulation; the rates stand."""
    if k == 1.0:
        return figures
    out = dict(figures)
    for key in (FLOPS_MODEL, FLOPS_HARDWARE, BYTES_MODEL):
        m = out.get(key)
        if m is not None and m.value is not None:
            out[key] = m.model_copy(update={"value": m.value * k, "note": f"{m.note}; x {k:g} micro-batches per "
                                            "optimizer step (gradient accumulation)"})
    return out


def _per_batch(time_s: float | None, k: float) -> float | None:
    return time_s / k if time_s else time_s


def _recomputed_per_batch(recomputed: tuple[float | None, str] | None,
                          k: float) -> tuple[float | None, str] | None:
    """A counted optimizer step's hardware FLOPs, per micro-batch (:func:`per_optimizer_step` scales back)."""
    if recomputed is None or recomputed[0] is None or k == 1.0:
        return recomputed
    return recomputed[0] / k, recomputed[1]


def _blocks_per_step(blocks: list[Block], k: float) -> list[Block]:
    """Blocks' FLOPs and bytes of one micro-batch as the optimizer step's, whose time the blocks have."""
    if k == 1.0:
        return blocks
    return [b.model_copy(update={"flops": b.flops * k if b.flops is not None else None,
                                 "bytes": b.bytes * k if b.bytes is not None else None}) for b in blocks]


def no_cache_note(run: Run, kv_cache: bool, decode_tokens: int) -> None:
    """Say, in a generation run without a KV cache, what its decode FLOPs count."""
    if kv_cache or not traits(run.mode).generates or not decode_tokens:
        return
    run.notes.append("no KV cache: every decode step re-ran the model over the whole sequence so far. The model "
                     "FLOPs (decode MFU, the decode blocks' FLOPs and the roofline) count the new tokens' work, "
                     "what a step through a cache does; the hardware FLOPs (decode HFU) count the recomputation "
                     "that ran, so MFU against HFU shows what the missing cache costs")


def passes(run: Run) -> tuple[Pass, ...]:
    """The passes the run's compute figures are for: its training step, or its prefill and decode steps."""
    return traits(run.mode).passes  # type: ignore[return-value]  # names.PASS_PHASES' keys


def pass_time_s(run: Run, pass_: str, batch: int | None, decode_steps: int) -> float | None:
    """The measured time of one pass, in seconds (None: not timed): the clean training step, the prefill
    (ttft), or the decode steps of a generation."""
    if pass_ != "decode":
        ms = run.value(_PASS_TIMING[pass_])
        return ms / 1e3 if ms else None
    # One measured time for every decode figure: the real decode time behind decode_tokens_per_s
    # (batch x tokens / decode time), not the median TPOT x tokens (they differ on a noisy run); TPOT
    # x tokens only where no decode throughput was had.
    dtps, tpot = run.value(DECODE_TOKENS_PER_S), run.value(TPOT)
    if dtps and batch and decode_steps:
        return batch * decode_steps / dtps
    return tpot * decode_steps / 1e3 if tpot and decode_steps else None


_PASS_TIMING = {"train": STEP_TIME, "prefill": TTFT}


def put_pass(run: Run, pass_: str, figures: dict[str, Metric]) -> None:
    """One pass's compute figures into the run, under its keys (``mfu``, ``prefill.mfu``, ...)."""
    run.metrics.update({cost_key(pass_, k): v for k, v in figures.items()})


def _roofline(run: Run, folder: Path, dtype: str, model: str, plots: bool) -> None:
    """The blocks' roofline points (and the plot) from their FLOPs, bytes and measured times."""
    from lmprof.hardware.calibrate import resolve_peak

    kind = run.env.device.split(":")[0]
    peak = resolve_peak(run.env.device_name, kind, dtype)
    if not peak.flops_per_s or not peak.bytes_per_s:
        run.notes.append(f"no roofline: {peak.note}")
        return
    points = block_roofline(run.blocks, peak.flops_per_s, peak.bytes_per_s, overhead_threshold=DEFAULT_OVERHEAD_THRESHOLD)
    run.tables["roofline"] = [p.to_dict() for p in points]
    if not points:
        return
    # Only matmul blocks: elementwise blocks carry rough per-element FLOP estimates (a residual's
    # backward is a pass-through), so their position says little about the ceiling.
    over = [p for p in points if p.name in MATMUL_BLOCKS and p.roof_fraction is not None and p.roof_fraction > 1.05]
    if over:
        worst = max(over, key=lambda p: p.roof_fraction or 0)
        run.notes.append(
            f"{len(over)} block(s) ran above the roofline (up to {100 * (worst.roof_fraction or 0):.0f}% for "
            f"{worst.name} {worst.phase}): the ceiling ({peak.source}) is below what this device achieves; "
            "for calibrated ceilings rerun `lmprof calibrate` on an idle machine")
    if not plots:
        return
    from lmprof.show.roofline_plot import plot_roofline

    path = plot_roofline(
        points, peak_flops=peak.flops_per_s, peak_bytes_per_s=peak.bytes_per_s, out=folder / "roofline.png",
        device=run.env.device_name, dtype=dtype, model=model,
        phase="/".join(sorted({p.phase for p in points})), measured=True,
        note=f"peak: {peak.source}" + (f", bandwidth {peak.bytes_source}" if peak.bytes_source else ""),
    )
    if path:
        run.files["roofline"] = Path(path).name
