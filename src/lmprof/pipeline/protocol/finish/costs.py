"""Attach FLOP and byte counts, MFU and the roofline to a finished run.

Analytic counts need the model's shape (the built-in GPT, or any Hugging Face family that
:func:`lmprof.estimate.models.shape_from_config` describes); a module lmprof cannot describe gets a
note instead of invented numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from lmprof.estimate.flops import conventions_for
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.mfu import Mode, block_roofline, facts_mfu_metrics, fill_block_costs, fill_facts_block_costs, mfu_metrics
from lmprof.estimate.roofline import DEFAULT_OVERHEAD_THRESHOLD
from lmprof.names import MATMUL_BLOCKS
from lmprof.record.run import Metric, Run
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
) -> None:
    """Fill block FLOPs/bytes, MFU figures, the roofline table and (with ``plots``) roofline.png."""

    kind = run.env.device.split(":")[0]
    # Hugging Face models compute logits at every prompt position, the built-in GPT at the last one.
    conventions = conventions_for(shape)

    def figures_for(mode: Mode, time_s: float | None, decode_tokens: int = 1) -> dict[str, Metric]:
        return mfu_metrics(shape, batch=batch, seq_len=seq_len, mode=mode, time_s=time_s,
                           decode_tokens=decode_tokens, device_name=run.env.device_name, device_kind=kind,
                           dtype=dtype, attention=attention, conventions=conventions)

    if run.mode == "train":
        step = run.metrics.get("step_time")
        run.metrics.update(figures_for("train", step.value / 1e3 if step and step.value else None))
    else:
        ttft = run.metrics.get("ttft")
        prefill_s = ttft.value / 1e3 if ttft and ttft.value else None
        # One measured time for every decode figure: the real decode time behind decode_tokens_per_s
        # (batch x tokens / decode time), not the median TPOT x tokens (they differ on a noisy run).
        dtps = run.metrics.get("decode_tokens_per_s")
        decode_s = batch * decode_tokens / dtps.value if dtps and dtps.value and decode_tokens else None
        phases: tuple[tuple[Mode, float | None], ...] = (("prefill", prefill_s), ("decode", decode_s))
        for phase, time_s in phases:
            figures = figures_for(phase, time_s, decode_tokens=max(decode_tokens, 1))
            if phase == "decode" and not decode_tokens:  # generate(max_new_tokens=1): the prefill is all there is
                figures = {k: Metric.na(v.unit, "no decode step: each generation was its prefill only", v.source)
                           for k, v in figures.items()}
            run.metrics.update({f"{phase}.{k}": v for k, v in figures.items()})
    # decode_tokens scales the decode blocks, of which a prefill-only generation has none
    run.blocks = fill_block_costs(run.blocks, shape, batch=batch, seq_len=seq_len, dtype=dtype,
                                  decode_tokens=max(decode_tokens, 1), attention=attention, conventions=conventions)
    _roofline(run, folder, dtype, shape.name or "model", plots)


def add_model_costs(run: Run, folder: Path, facts: ModelFacts, *, dtype: str, decode_tokens: int = 1,
                    plots: bool = True) -> None:
    """:func:`add_costs` for a model the describer read (a family lmprof has no formulas for)."""
    kind = run.env.device.split(":")[0]
    if run.mode == "train":
        step = run.metrics.get("step_time")
        run.metrics.update(facts_mfu_metrics(facts, mode="train", time_s=step.value / 1e3 if step and step.value
                                             else None, device_name=run.env.device_name, device_kind=kind, dtype=dtype))
    else:
        ttft = run.metrics.get("ttft")
        dtps = run.metrics.get("decode_tokens_per_s")
        B = facts.batch
        decode_s = B * decode_tokens / dtps.value if dtps and dtps.value and decode_tokens else None
        for phase, time_s in (("prefill", ttft.value / 1e3 if ttft and ttft.value else None), ("decode", decode_s)):
            figures = facts_mfu_metrics(facts, mode=phase, time_s=time_s,  # type: ignore[arg-type]  # prefill/decode
                                        device_name=run.env.device_name, device_kind=kind, dtype=dtype,
                                        decode_steps=max(decode_tokens, 1))
            run.metrics.update({f"{phase}.{k}": v for k, v in figures.items()})
    run.blocks = fill_facts_block_costs(run.blocks, facts, decode_steps=max(decode_tokens, 1))
    run.notes.append(f"FLOPs, bytes and block costs read off the model on the meta device ({facts.family!r} has no "
                     "lmprof formulas): torch's FlopCounterMode formulas over the ops it runs"
                     + (f"; decode: one step at KV length {facts.context} times the steps" if run.mode == "infer"
                        else ""))
    _roofline(run, folder, dtype, facts.name or "model", plots)


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
