"""Every figure a run gets beyond its timings, in one place for every entry point.

``lmprof train``, ``lmprof infer``, ``lmprof run``, ``lmprof.profile()`` and the callbacks all end
here: the memory breakdown (measured beside the analytic estimate), FLOPs with MFU/HFU/MBU and the
roofline (lmprof's formulas when it describes the model, else the FLOPs torch's FlopCounterMode
counted on one step outside the timed windows), the KV cache, and energy over the clean window.
What an entry point knows about its workload comes in as :class:`Facts`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmprof.analysis.counted_flops import counted_mfu_metrics
from lmprof.estimate.dropout import Dropout
from lmprof.estimate.memory import MemoryEstimate, estimate_memory
from lmprof.estimate.memory.result import DTYPE_BYTES
from lmprof.hardware import quick_bandwidth
from lmprof.measure.energy.monitor import EnergyResult
from lmprof.measure.memory import MeasuredMemory
from lmprof.measure.model_facts.quantized import Quantized
from lmprof.measure.other_models import OtherModel, beyond_model
from lmprof.pipeline.protocol.finish.costs import (add_costs, add_model_costs, add_varied_costs, add_varied_model_costs,
                                                   pass_time_s, passes, put_pass, compute_na)
from lmprof.pipeline.protocol.windows.shapes import StepShapes
from lmprof.pipeline.protocol.finish.memory import add_memory, held_logits
from lmprof.pipeline.protocol.finish.quantized import COUNTS_NO_QUANTIZED, quantized_bytes, quantized_note, withhold_peak
from lmprof.pipeline.protocol.finish.record import add_energy
from lmprof.modes import traits
from lmprof.record.catalogue import FLOPS_HARDWARE, FLOPS_MODEL, HFU, KV_CACHE, KV_CACHE_ESTIMATED, cost_key
from lmprof.record.run import Metric, Run
from lmprof.errors import LmprofError
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.mfu import per_pass
from lmprof.estimate.shape import ModelShape

ESTIMATED_OPTIMIZERS = ("adamw", "sgd")


@dataclass
class CountedFlops:
    """FLOPs torch's FlopCounterMode counted on one step (or generation) outside the timed windows."""

    where: str  # which step, said in the record ("warm-up step 3")
    step: int | None = None  # training: one step
    prefill: int | None = None  # inference: one generation's prefill ...
    decode: int | None = None  # ... and all its decode steps
    recomputed: bool = False  # training: the step recomputed checkpointed activations (in the count)
    others: bool = False  # training: the step ran other models' forwards too (in the count)

    def of(self, pass_: str) -> int | None:
        """The count of one pass (names.PASS_PHASES): ``train`` is the training step."""
        return {"train": self.step, "prefill": self.prefill, "decode": self.decode}[pass_]


@dataclass
class Facts:
    """What the figures need to know about what ran: from lmprof's workload, or observed in the user's code."""

    title: str
    dtype: str  # compute dtype (fp32, bf16, fp16)
    tf32: bool = False  # fp32 matmuls ran on CUDA's TF32 tensor cores: the peak is TF32's
    shape: ModelShape | None = None  # lmprof's description of the model; None: none exists
    batch: int | None = None
    seq_len: int | None = None  # training sequence, or the prompt
    attention: Literal["math", "sdpa"] = "math"
    new_tokens: int = 0  # inference: tokens generated per sequence (prefill's included)
    kv_cache: bool = True
    last_logits_only: bool | None = None  # the prefill's logits: last position only (None: the model's convention)
    param_dtype: str | None = None  # None: fp32 parameters (autocast does the rest)
    optimizer: str | None = None
    dropout: float | Dropout = 0.0  # one rate, or by site (a Hugging Face config's)
    memory: MeasuredMemory | None = None
    counted: CountedFlops | None = None
    # training: the step's backward recomputes checkpointed activations (None: not seen either way)
    recomputes: bool | None = None
    others: list[OtherModel] | None = None  # other models the step ran (a teacher, a reference, an assistant)
    forward_only: bool = False  # training steps whose forwards all ran without grad, with no backward
    master_weights: bool | None = None  # an fp32 master copy of 16-bit parameters (None: the estimate's default)
    several_per_forward: bool = False  # inference: a forward made several tokens (assisted, speculative decoding)
    micro_batches: float = 1.0  # training: batches of batch x seq_len per optimizer step (gradient accumulation)
    step_shapes: StepShapes | None = None  # training: what each clean and profiled step's forwards ran on
    # inference: each clean generation's (prefill s, decode s, batch, prompt, tokens); None: the loop's owner described it
    generations: list[tuple[float, float, int, int, int]] | None = None
    cache_bytes: int | None = None  # measured KV cache after a generation
    energy: EnergyResult | None = None
    energy_steps: int = 0  # steps (generations) in the metered window
    tokens_per_step: int | None = None  # training tokens per step / generated tokens per generation
    plots: bool = True
    config: dict[str, Any] | None = None  # a Hugging Face model's config, for the describer (no formulas)
    # How the model departs from what its config builds (measure/model_facts/departure.py); FLOPs are then counted
    departs: str | None = None
    model_params: int | None = None  # the model's own parameters, which the describer's must equal
    quantized: Quantized | None = None  # how its weights are quantized (measure/model_facts/quantized.py); None: not
    cached_prefix: int = 0  # prompt tokens a cache passed to generate() held (the prefill did not run them)


def add_figures(run: Run, folder: Path, facts: Facts) -> None:
    """Fill memory, FLOP/MFU/roofline, KV-cache and energy figures of ``run`` (its timings already in)."""
    described = _described(run, facts)
    if facts.departs:
        from lmprof.measure.model_facts.departure import departure_note

        run.notes.append(departure_note(facts.departs))
    if facts.quantized is not None:
        run.notes.append(quantized_note(facts.quantized))
    generates = traits(run.mode).generates
    if generates:
        _kv_cache(run, facts, described)
    add_memory(run, folder, facts.memory, _estimate(run, facts, described), facts.title, plots=facts.plots)
    decode_tokens = max(facts.new_tokens - 1, 0) if generates else 1
    peak_dtype = "tf32" if facts.tf32 and facts.dtype == "fp32" else facts.dtype  # the peak MFU is against
    # why the bytes the formulas count, or those of a model read off the meta device, are not the run's
    no_bytes = quantized_bytes(facts.quantized)
    no_described_bytes = no_bytes or _autocast_bytes(facts)
    recomputed = _hardware_step(facts) if not generates else None
    if facts.others and generates:
        run.notes.append(_assistant_note(facts.others))
    elif facts.others:
        apart = [o for o in facts.others if not o.cotrained]
        cotrained = [o for o in facts.others if o.cotrained]
        run.notes.extend(([_others_note(apart, counted=facts.counted is not None)] if apart else [])
                         + ([_cotrained_note(cotrained, facts.shape is not None, facts.counted is not None)]
                            if cotrained else []))
    varied = _varied(facts, generates)
    if varied is not None and facts.shape is not None:
        steps, blocks_from, note = varied
        with quick_bandwidth.allowed():
            add_varied_costs(run, folder, facts.shape, steps, blocks_from, dtype=peak_dtype, attention=facts.attention,
                             plots=facts.plots, recomputed_step=recomputed, last_logits_only=facts.last_logits_only,
                             note=note, no_bytes=no_bytes)
    elif varied is not None and (by_shape := _described_by_shape(run, facts, varied)) is not None:
        steps, blocks_from, note = varied
        with quick_bandwidth.allowed():
            add_varied_model_costs(run, folder, by_shape, steps["train"], blocks_from, dtype=peak_dtype,
                                   plots=facts.plots, recomputed_step=recomputed, note=note,
                                   no_bytes=no_described_bytes)
    elif varied is not None:
        what = "generations" if generates else "steps"
        compute_na(run, f"the clean {what} ran different shapes, and {_no_formulas(facts)} to count each its own: "
                       f"one {what[:-1]}'s FLOPs are not theirs")
        run.notes.append(f"no FLOP figures: the clean {what} ran different shapes and {_no_formulas(facts)} (a model "
                         "read off the meta device, or counted once, is at one shape)")
    elif facts.shape is not None and facts.batch and facts.seq_len:
        # The timed and profiled windows are over: a CPU without a cached bandwidth may measure one here.
        with quick_bandwidth.allowed():
            add_costs(run, folder, facts.shape, batch=facts.batch, seq_len=facts.seq_len, dtype=peak_dtype,
                      attention=facts.attention, decode_tokens=decode_tokens, plots=facts.plots,
                      kv_cache=facts.kv_cache, last_logits_only=facts.last_logits_only, recomputed_step=recomputed,
                      micro_batches=facts.micro_batches, no_bytes=no_bytes)
    elif described is not None:
        with quick_bandwidth.allowed():
            counted = facts.counted
            add_model_costs(run, folder, described, dtype=peak_dtype, decode_tokens=decode_tokens,
                            plots=facts.plots, kv_cache=facts.kv_cache,
                            counted_decode=(counted.decode, counted.where) if counted and counted.decode else None,
                            recomputed_step=recomputed, micro_batches=facts.micro_batches,
                            no_bytes=no_described_bytes)
        _check_against_count(run, described, facts.counted)
    elif facts.counted is not None and facts.quantized is not None:
        compute_na(run, f"{COUNTS_NO_QUANTIZED}, and {_no_formulas(facts)}")
        run.notes.append(f"no FLOP count: {COUNTS_NO_QUANTIZED} and {_no_formulas(facts)}")
    elif facts.counted is not None:
        _counted(run, facts.counted, peak_dtype, _no_formulas(facts))
    elif facts.forward_only:
        run.notes.append("no FLOP count: no step ran a backward, and a training step's FLOPs are a forward's and a "
                         "backward's; MFU and roofline are n/a")
    elif not any(n.startswith("no FLOP count") for n in run.notes):  # one line, the most specific one
        run.notes.append("no FLOP count: lmprof has formulas for this model but saw no input's shape (neither token "
                         "ids nor embeddings reached a hook: a model inside compiled code with no call of it outside "
                         "that code, as Lightning's compiled training_step, shows none); MFU and roofline are n/a"
                         if facts.shape is not None and not (facts.batch and facts.seq_len) else
                         "no FLOP count: lmprof has no formulas for this model and none was counted "
                         "(FlopCounterMode needs a warm-up step lmprof sees begin and end); MFU and roofline are n/a")
    if facts.several_per_forward or (varied is not None and generates and not facts.kv_cache):
        # what ran beyond the model's own tokens (a draft, rejected tokens, a recomputation) is not counted
        why = ("several tokens per forward (assisted or speculative decoding): the draft model's FLOPs and the "
               "rejected tokens' are not counted" if facts.several_per_forward else
               "no KV cache, and the generations ran different shapes: the recomputation is not counted for each")
        for key, unit in ((FLOPS_HARDWARE, "FLOP"), (HFU, "%")):
            if cost_key("decode", key) in run.metrics:
                run.metrics[cost_key("decode", key)] = Metric.na(unit, why, source="derived" if unit == "%" else "estimated")
    if facts.quantized is not None:
        withhold_peak(run, facts.quantized)
    if facts.cached_prefix and generates:
        _cached_prefix(run, facts.cached_prefix)
    if facts.energy is not None:  # after the FLOP counts, so FLOP/J can be derived
        _energy(run, facts)


Varied = tuple[dict[str, list[tuple[float, tuple[tuple[int, ...], ...]]]], list[tuple[tuple[int, ...], ...]], str]


def _varied(f: Facts, generates: bool) -> Varied | None:
    """Per pass, each clean step's (or generation's) time and shapes, the shapes the blocks' FLOPs average
    over, and the run's note, when the clean steps ran different shapes; None when they ran one."""
    if not generates and f.step_shapes is not None and f.step_shapes.varied:
        return ({"train": [(s, tuple(fw)) for s, fw in f.step_shapes.clean]}, [tuple(fw) for fw in f.step_shapes.profiled],
                f"the clean steps ran different shapes ({len({fw for _, fw in f.step_shapes.clean})} distinct; padding to "
                "each batch's longest sequence does this): each step's FLOPs and bytes are its own forwards', MFU is "
                "their sum over the steps' time, the blocks' FLOPs are the profiled steps' mean")
    gens = f.generations or []
    # Prompts of one shape whose generations stopped at different lengths (an end-of-sequence token) are
    # one shape: the decode figures are per token (the decode rate's time), whatever each one's count.
    if not generates or len({(b, t) for _, _, b, t, _ in gens}) < 2:
        return None
    return ({"prefill": [(p, ((b, t),)) for p, _, b, t, _ in gens],
             "decode": [(d, ((b, t, n - 1),)) for _, d, b, t, n in gens if n > 1 and d > 0]},
            [((b, t, n - 1),) for _, _, b, t, n in gens],
            f"the clean generations ran different shapes ({len({(b, t) for _, _, b, t, _ in gens})} distinct "
            "batch x prompt): each generation's prefill and decode FLOPs are its own, MFU their sum over "
            "the generations' prefill and decode time, the blocks' FLOPs the clean generations' mean")


# A model read off the meta device once per shape the clean training steps ran, up to this many shapes.
MAX_DESCRIBED_SHAPES = 8


def _described_by_shape(run: Run, f: Facts, varied: Varied) -> dict[tuple[int, int], ModelFacts] | None:
    """A Hugging Face model lmprof has no formulas for, read off the meta device at each (batch, sequence)
    its clean and profiled training steps ran; None for generations, for more than
    :data:`MAX_DESCRIBED_SHAPES` shapes, or a model the describer cannot read."""
    steps, blocks_from, _ = varied
    if "train" not in steps or f.config is None or f.departs:
        return None
    shapes = {(fw[0], fw[1]) for _, forwards in steps["train"] for fw in forwards}
    shapes |= {(fw[0], fw[1]) for forwards in blocks_from for fw in forwards}
    if len(shapes) > MAX_DESCRIBED_SHAPES:
        run.notes.append(f"the clean steps ran {len(shapes)} shapes: lmprof reads a model without formulas off the meta "
                         f"device at {MAX_DESCRIBED_SHAPES} at the most")
        return None
    from lmprof.measure.model_facts import describe

    try:
        by_shape = {(b, t): describe(f.config, batch=b, seq_len=t, dtype=_built_dtype(f), phases=("train",),
                                     memory=False) for b, t in sorted(shapes)}
    except LmprofError as exc:
        run.notes.append(f"nothing read off the model at each shape: {exc}")
        return None
    return by_shape if _fits(f, next(iter(by_shape.values()))) else None


def _hardware_step(f: Facts) -> tuple[float | None, str] | None:
    """A training step that ran more than the model's FLOPs (it recomputes checkpointed activations, or runs
    other models too): its hardware FLOPs (what ran, counted by FlopCounterMode on a real step) and their
    note; None when it ran the model's FLOPs only."""
    beyond = [what for what, seen in ((RECOMPUTES, f.recomputes), (OTHERS, beyond_model(f.others, f.shape is not None)))
              if seen]
    if not beyond:
        return None
    what, c = " and ".join(beyond), f.counted
    if c is not None and c.step:
        return float(c.step), f"counted by torch's FlopCounterMode on {c.where}: {what}, and the count has them"
    return None, (f"{what}, and no step was counted with FlopCounterMode in this run (raise --warmup): hardware "
                  "FLOPs are n/a")


RECOMPUTES = "the backward re-ran checkpointed parts of the forward (activation checkpointing)"
OTHERS = "the step ran other models' forwards too"


def _cotrained_note(cotrained: list[OtherModel], formulas: bool, counted: bool) -> str:
    one = len(cotrained) == 1
    flops = ("in the hardware FLOPs and HFU (counted), not in the model FLOPs and MFU, which lmprof's formulas give "
             "for the profiled model alone" if formulas and counted
             else "in the model FLOPs and MFU with the model's (the count is the whole training step)" if counted
             else "not in any FLOP figure (none was counted)")
    return (f"the model's own optimizer also trains {'another module' if one else f'{len(cotrained)} other modules'} "
            f"the loop calls apart from it (an encoder-decoder's or a two-tower model's other half, a value head): "
            f"{', '.join(o.said() for o in cotrained)}. {'Its' if one else 'Their'} forwards are the other_models row; "
            f"{'its' if one else 'their'} parameters, gradients and optimizer state are in the memory figures, "
            f"{'its' if one else 'their'} work {flops}")


def _others_note(others: list[OtherModel], counted: bool) -> str:
    one = len(others) == 1
    beside = "; one with trained parameters is a module trained beside it" if any(o.trained for o in others) else ""
    flops = ("in the hardware FLOPs and HFU (counted), not in the model FLOPs and MFU, which are the profiled "
             "model's" if counted else "not in any FLOP figure (none was counted)")
    return (f"the step also ran {'another model' if one else f'{len(others)} other models'} than the one profiled "
            f"(a teacher, a reference or a reward model{beside}): {', '.join(o.said() for o in others)}. "
            f"{'Its' if one else 'Their'} forwards are the other_models row; {'its' if one else 'their'} work is "
            f"{flops}")


def _assistant_note(others: list[OtherModel]) -> str:
    one = len(others) == 1
    return (f"the generation also ran {'another model' if one else f'{len(others)} other models'} than the one "
            f"profiled (an assistant model: speculative decoding's draft; a reward or safety model): "
            f"{', '.join(o.said('generation') for o in others)}. "
            f"{'Its' if one else 'Their'} forwards are the other_models row; TTFT, TPOT and the latency are the "
            "generation's as its caller saw it, with them; MFU and MBU count the profiled model's FLOPs and bytes")


def _autocast_bytes(f: Facts) -> str | None:
    """Why a model read off the meta device has no bytes for this run: it is built in its weights' dtype,
    and the forwards ran under autocast in another (None: they ran in the weights' dtype)."""
    params = f.param_dtype or f.dtype
    if params == f.dtype:
        return None
    return (f"the forwards ran under {f.dtype} autocast and the model read off the meta device is built in its "
            f"weights' {params}: its bytes are not the run's")


def _built_dtype(f: Facts) -> str:
    """The dtype the describer builds the model in: its parameters', where the describer builds that one."""
    pdt = f.param_dtype or "fp32"
    return pdt if pdt in ("fp32", "bf16", "fp16") else "fp32"


def _described(run: Run, f: Facts) -> ModelFacts | None:
    """A Hugging Face model lmprof has no formulas for, read off the meta device at the run's shapes."""
    if f.shape is not None or f.config is None or not f.batch or not f.seq_len:
        return None
    from lmprof.measure.model_facts import describe

    steps = max(f.new_tokens - 1, 1)
    try:  # decode: the middle step's context, times the steps (exact where the cost is linear in the context)
        facts = describe(f.config, batch=f.batch, seq_len=f.seq_len, context=f.seq_len + (steps + 1) // 2, past=0,
                         dtype=_built_dtype(f), phases=traits(run.mode).passes)
    except LmprofError as exc:
        run.notes.append(f"nothing read off the model: {exc}")
        return None
    return facts if _fits(f, facts) else None


def _fits(f: Facts, described: ModelFacts) -> bool:
    """Whether the model read off the meta device from the config has the running model's parameters; else
    the model departs from its config (:attr:`Facts.departs` set, and the FLOPs are counted instead)."""
    from lmprof.measure.model_facts.departure import departure_clause

    if f.model_params is None or described.params == f.model_params:
        return True
    f.departs = departure_clause(f.model_params, described.params)
    return False


def _check_against_count(run: Run, described: ModelFacts, counted: CountedFlops | None) -> None:
    """The FLOPs read off the model beside what FlopCounterMode counted on a real step, when both exist."""
    if counted is None:
        return
    first = passes(run)[0]  # the training step, or the prefill
    what, read, count = per_pass(first, 1), described.flops(first), counted.of(first)
    if read and count:
        diff = 100.0 * (read - count) / count
        run.notes.append(f"{what} FLOPs read off the model {read:,.0f}, counted on {counted.where} {count:,.0f}"
                         + (" (equal)" if read == count else f" ({diff:+.2f}%)")
                         + ("; the count has the recomputation of checkpointed activations" if counted.recomputed
                            else "") + ("; the count has the other models' forwards" if counted.others else ""))


def _estimate(run: Run, f: Facts, described: ModelFacts | None = None) -> MemoryEstimate | None:
    if f.quantized is not None:
        run.notes.append(f"no memory estimate: {quantized_bytes(f.quantized)}; memory figures are measured only")
        return None
    unmodelled = sorted({d for d in (f.dtype, f.param_dtype) if d and d not in DTYPE_BYTES})
    if unmodelled:
        run.notes.append(f"no memory estimate: the formulas model {', '.join(DTYPE_BYTES)} and this run is "
                         f"{' and '.join(unmodelled)}; memory figures are measured only")
        return None
    if described is not None and f.batch and f.seq_len:
        kind = run.env.device.split(":")[0]
        if (f.param_dtype or "fp32") != f.dtype:
            run.notes.append(f"no memory estimate: autocast ({f.dtype} compute, {f.param_dtype or 'fp32'} parameters) "
                             "is not modelled for a model read off the meta device; memory figures are measured only")
            return None
        if traits(run.mode).generates:
            return estimate_memory(described, batch=f.batch, seq_len=f.seq_len, mode="infer", dtype=f.dtype,
                                   param_dtype=f.dtype, device_kind=kind,
                                   new_tokens=f.new_tokens - 1 if f.kv_cache and f.new_tokens else 0)
        if f.optimizer in ESTIMATED_OPTIMIZERS:
            return estimate_memory(described, batch=f.batch, seq_len=f.seq_len, dtype=f.dtype, param_dtype=f.dtype,
                                   device_kind=kind, optimizer=f.optimizer,  # type: ignore[arg-type]  # checked just above
                                   master_weights=f.master_weights)
    if f.shape is None or not f.batch or not f.seq_len:
        return None
    kind = run.env.device.split(":")[0]
    if traits(run.mode).generates:
        return estimate_memory(f.shape, batch=f.batch, seq_len=f.seq_len, mode="infer", dtype=f.dtype,
                               param_dtype=f.param_dtype or f.dtype, attention=f.attention, device_kind=kind,
                               new_tokens=f.new_tokens - 1 if f.kv_cache and f.new_tokens else 0)
    if f.optimizer not in ESTIMATED_OPTIMIZERS:
        run.notes.append(f"no memory estimate for optimizer {f.optimizer or 'unknown'!r} (formulas exist for "
                         f"{', '.join(ESTIMATED_OPTIMIZERS)}): memory figures are measured only")
        return None
    return estimate_memory(f.shape, batch=f.batch, seq_len=f.seq_len, dtype=f.dtype,
                           param_dtype=f.param_dtype or "fp32", attention=f.attention,
                           optimizer=f.optimizer,  # type: ignore[arg-type]  # checked against ESTIMATED_OPTIMIZERS
                           device_kind=kind, dropout=f.dropout, master_weights=f.master_weights,
                           hold_logits=held_logits(f.memory, f.batch, f.seq_len, f.shape.vocab_size) is not None)


def _kv_cache(run: Run, f: Facts, described: ModelFacts | None = None) -> None:
    s = f.shape
    if described is not None and f.batch and f.seq_len and f.new_tokens and (why := _autocast_bytes(f)):
        run.metrics[KV_CACHE_ESTIMATED] = Metric.na("B", why, source="estimated")  # its cache is autocast's
    elif described is not None and f.batch and f.seq_len and f.new_tokens:
        tokens = f.seq_len + f.new_tokens - 1
        kinds = ", ".join(described.cache_by_kind(tokens))
        run.metrics[KV_CACHE_ESTIMATED] = Metric(
            value=described.cache_bytes(f.batch, tokens) if f.kv_cache else 0, unit="B", source="estimated",
            note=f"the model's own cache ({kinds}) after prompt + new tokens - 1, read off the model on the meta device")
    elif s is not None and f.batch and f.seq_len and f.new_tokens:
        width = DTYPE_BYTES.get(f.dtype, 4)  # under autocast the projections, and so the cache, are in its dtype
        # The last new token is never fed back, so the cache ends holding prompt + new - 1 tokens.
        est = s.kv_cache_elements(f.seq_len + f.new_tokens - 1) * f.batch * width
        run.metrics[KV_CACHE_ESTIMATED] = Metric(
            value=est if f.kv_cache else 0, unit="B", source="estimated",
            note="layers x K and V width x (prompt + new tokens - 1) x batch x bytes (windows, latents as the model "
                 "keeps them)")
    if f.cache_bytes is not None:
        run.metrics[KV_CACHE] = Metric(value=f.cache_bytes, unit="B", source="measured",
                                       note="bytes of the cache tensors after a whole generation")
    if f.memory is not None and f.memory.kv_cache is None and f.cache_bytes is not None:
        f.memory.kv_cache = f.cache_bytes  # the cache is created inside the generation


def _no_formulas(f: Facts) -> str:
    """Why the FLOPs are not lmprof's formulas' or the describer's, as a clause."""
    return ("lmprof's formulas describe the config's model, which this one departs from" if f.departs
            else "lmprof has no formulas for this model")


def _counted(run: Run, c: CountedFlops, dtype: str, why: str) -> None:
    device_name, kind = run.env.device_name, run.env.device.split(":")[0]
    batch, steps = run.config.get("batch_size"), int(run.config.get("new_tokens") or 1) - 1
    for p in passes(run):
        flops = c.of(p)
        if flops:
            put_pass(run, p, counted_mfu_metrics(flops, pass_time_s(run, p, batch, steps), where=c.where,
                                                 what=per_pass(p, steps), device_name=device_name, device_kind=kind,
                                                 dtype=dtype, beyond=_beyond(c) if p == "train" else None))
    run.notes.append(f"FLOPs counted with torch's FlopCounterMode on {c.where} ({why}): MFU from the count; "
                     "per-block FLOPs, MBU and the roofline are n/a")


def _cached_prefix(run: Run, cached: int) -> None:
    """A prefill that ran only its prompt's last tokens (the rest came from a cache passed to generate()):
    the formulas count a whole prompt's prefill, so its compute figures and blocks' FLOPs are n/a; decode,
    whose context the cache holds, stands."""
    why = (f"the prefill ran the prompt's last tokens only: {cached:,} came from a cache passed to generate() "
           "(past_key_values), and lmprof's formulas count a whole prompt's prefill")
    compute_na(run, why, only="prefill")
    run.blocks = [b.model_copy(update={"flops": None, "bytes": None}) if b.phase == "prefill" else b
                  for b in run.blocks]
    run.notes.append(f"no prefill FLOPs: {why}; decode's figures stand (its context is the whole prompt's)")


def _beyond(c: CountedFlops) -> str | None:
    """What a counted training step ran beyond the model's FLOPs, as a clause; None: nothing."""
    beyond = [what for what, seen in ((RECOMPUTES, c.recomputed), (OTHERS, c.others)) if seen]
    return " and ".join(beyond) or None


def _energy(run: Run, f: Facts) -> None:
    assert f.energy is not None
    n, mode = f.energy_steps, traits(run.mode)
    per_step = [run.value(cost_key(p, FLOPS_MODEL)) for p in mode.passes]  # a generation: both passes
    flops = sum(x for x in per_step if x) * n if all(per_step) else None
    add_energy(run, f.energy, steps=n, tokens=(f.tokens_per_step or 0) * n or None, flops=flops, mode=run.mode)
