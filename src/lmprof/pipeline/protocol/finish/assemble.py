"""A session's :class:`Measured` record as the Run every door writes: timings, blocks, figures.

The trace is read by lmprof's reader and attributed (compiled kernels named), blocks are reconciled
to the clean step, the noise verdict and the stopwatch check are marked, and every figure beyond the
timings comes from figures.py: the same code for ``lmprof train`` / ``infer``, ``lmprof run``,
``lmprof.profile()`` and the callbacks.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np

from lmprof.analysis.block_truth import mark_uncertain
from lmprof.analysis.noise import input_paced
from lmprof.measure.profiling import ProfiledPhase, op_table
from lmprof.measure.window import compress, drop_partial
from lmprof.pipeline.protocol.finish.figures import Facts, add_figures
from lmprof.pipeline.protocol.finish.measured import Measured
from lmprof.pipeline.protocol.finish.record import add_compile_report, assemble_run, mark_noise, overhead_metrics
from lmprof.pipeline.protocol.observed import Known
from lmprof.pipeline.protocol.timing import ROUGH
from lmprof.record.catalogue import (
    DECODE_TOKENS_PER_S, E2E_LATENCY, OUTPUT_TOKENS_PER_S, PARAMS, PREFILL_TOKENS_PER_S, PROFILER_OVERHEAD, STEP_TIME,
    TOKENS_PER_S, TOKENS_PER_STEP, TOTAL_TOKENS_PER_S, TPOT, TTFT, pick,
)
from lmprof.record.run import Basis, Metric, Run
from lmprof.trace.attribution import Attribution, attribute
from lmprof.trace.load import load_trace

# What each inference timing spans: the same for every loop (protocol/timing.py).
TTFT_SPANS = "from the generation's start to the end of its first forward (the prefill)"
E2E_SPANS = "one whole generation, from its start to its end, device synchronized"
TPOT_SPANS = "from the end of one forward to the end of the next (token choice included)"


def assemble(m: Measured, stopwatch: dict[Any, float] | None = None) -> Run:
    """The Run of a finished session; ``stopwatch``: a driver's stopwatch pass, (block, phase) -> ms."""
    att = _attribution(m)
    notes = list(m.notes)
    if att is None:
        notes.append("no profiled step completed: clean timing only, no block breakdown")
    metrics = _TIMINGS[m.spec.mode](m, att, notes)
    clean = metrics[pick("timing", m.spec.mode).name].value or 0.0
    if m.facts.params is not None:
        metrics[PARAMS] = Metric(value=m.facts.params, unit="count", source="measured")
    empty = Attribution(0, [], [], "cpu")
    phase = m.profile if (m.profile is not None and att is not None) else ProfiledPhase(m.folder / "trace.json.gz",
                                                                                      [], 0)
    run = assemble_run(m.spec.mode, m.device, m.folder, m.config, metrics, att or empty, clean, phase, notes)
    if m.noise is not None:
        before, after = m.noise
        timed = _timed(m)
        mark_noise(run, [s * 1e3 for s in timed], m.spec.unit, before, after, m.device.kind,
                   m.shapes.profiled_aside if m.shapes is not None else (),
                   judge_window=not (m.profile is not None and m.profile.stand_in), waits_ms=_waits_ms(m, timed))
    if stopwatch is not None:
        run.blocks = mark_uncertain(run.blocks, stopwatch)
    if att is None:
        run.tables.pop("attribution", None)
        if not (m.folder / "trace.json.gz").is_file():
            run.files.pop("trace", None)
    add_compile_report(run, m.compile, m.folder)
    run.notes.extend(m.figure_notes)
    _figures(run, m)
    for result in m.more:  # windows beyond the protocol's own put what they measured into the run
        result.add_to(run, m.folder)
    return run


def _figures(run: Run, m: Measured) -> None:
    """The figures derived from what was measured. One that fails to compute is left out, said in a note and
    in the summary: the step time and the blocks, measured already, are written whatever a formula did (an fp64
    model's memory estimate once raised here, and the user's run was lost with it). LMPROF_DEBUG raises it."""
    try:
        add_figures(run, m.folder, _facts(m, run))
    except Exception as exc:  # noqa: BLE001 - any failure of a formula: the measured run is kept
        if os.environ.get("LMPROF_DEBUG"):
            raise
        said = " ".join(str(exc).split())  # one line, and short: an error's text may hold a whole tensor
        said = said if len(said) <= 300 else said[:297] + "..."
        run.notes.append(f"some figures were not computed ({type(exc).__name__}: {said}): the ones written "
                         "before it are kept, the rest are missing from this run (please report it)")


def _attribution(m: Measured) -> Attribution | None:
    profiled = m.profile
    if profiled is None:
        return None
    if not profiled.steps:
        compress(profiled, m.folder / "trace.json.gz")
        return None
    table = load_trace(profiled.trace_path)  # the plain file: read faster than the .gz
    compress(profiled, m.folder / "trace.json.gz")
    drop_partial(table, profiled.steps)
    table.cache.clear()
    profiled.ops = op_table(table, profiled.steps)
    att = attribute(table, compiled=m.compile.kernel_graphs if m.compile is not None else ())
    return att if att.steps else None


def _rough(m: Measured) -> str | None:
    """The timing note of a run whose times are not clean ones (a script too short for the clean window)."""
    kind = m.timings.first_call
    return f"first call: includes warm-up costs (timed {ROUGH[kind]}), not a clean timing" if kind else None


def _basis(m: Measured) -> Basis:
    """What the run's timing figures rest on (record/run.py: Basis)."""
    return "first_call" if m.timings.first_call else "clean"


def _overhead(m: Measured, metrics: dict[str, Metric], att: Attribution | None) -> None:
    if att is not None:
        mode = m.spec.mode
        metrics.update(overhead_metrics(att, metrics[pick("timing", mode).name].value or 0.0, mode))
        if m.timings.first_call:
            metrics[PROFILER_OVERHEAD] = Metric.na("%", f"no clean {m.spec.unit} was timed to compare the profiled "
                                                          "one with")


def _waits_ms(m: Measured, timed: list[float]) -> list[float | None] | None:
    """Each of the ``timed`` clean steps' wait for its input, ms (None: generations, or a step of them whose
    first forward was not seen)."""
    if m.spec.traits.generates or len(m.timings.waits) != len(m.timings.steps):
        return None
    left = list(timed)
    out: list[float | None] = []
    for s, w in zip(m.timings.steps, m.timings.waits):
        if s in left:
            left.remove(s)
            out.append(None if w is None else w * 1e3)
    return out


def _timed(m: Measured) -> list[float]:
    """The clean steps' (or generations') seconds the timing figures come from: a training step that also ran
    an evaluation is left out (its time is the evaluation's too), unless every one did."""
    if m.spec.traits.generates or m.shapes is None:
        return m.timings.seconds()
    return m.shapes.training(m.timings.steps)


def _train_metrics(m: Measured, att: Attribution | None, notes: list[str]) -> dict[str, Metric]:
    steps, basis = _timed(m), _basis(m)
    metrics = {STEP_TIME: Metric.from_samples([s * 1e3 for s in steps], "ms", "measured",
                                              note=_rough(m) or m.step_means, basis=basis)}
    # Steps that wait unevenly for their input (analysis/noise.py): a median between the steps that waited and
    # the others is no step's, and the rates would overstate throughput; the mean is what throughput follows
    paced = input_paced([s * 1e3 for s in steps], _waits_ms(m, steps)) is not None
    mean = float(np.mean(steps)) if steps else 0.0
    if paced:
        metrics[STEP_TIME] = metrics[STEP_TIME].model_copy(update={
            "value": mean * 1e3, "note": f"{metrics[STEP_TIME].note or ''}; the mean of the clean steps, which wait "
                                         "unevenly for their input (see the note): throughput follows the mean"})
    _overhead(m, metrics, att)
    notes.extend(_passes_note(m))
    known_tokens = m.known.tokens_per_step if m.known is not None else None
    if known_tokens:
        metrics[TOKENS_PER_STEP] = Metric(value=known_tokens, unit="tokens", source="derived",
                                          note="batch x sequence length")
        metrics[TOKENS_PER_S] = Metric.from_samples([known_tokens / s for s in steps], "tokens/s", "derived",
                                                    basis=basis)
    elif m.shapes is not None and m.shapes.varied and m.timings.first_call is None:
        # each clean step's own tokens (its forwards' batch x sequence), beside its own time
        each = m.shapes.tokens()
        metrics[TOKENS_PER_STEP] = Metric(value=sum(n for n, _ in each) / len(each), unit="tokens", source="derived",
                                          note="the clean steps' mean of their forwards' batch x sequence (the steps "
                                               "ran different shapes)")
        metrics[TOKENS_PER_S] = Metric.from_samples([n / s for n, s in each], "tokens/s", "derived", basis=basis)
    elif m.tokens_per_step:
        tokens = m.tokens_per_step
        metrics[TOKENS_PER_STEP] = Metric(value=tokens, unit="tokens", source="derived",
                                          note="token ids of the distinct batches the model's forward ran on per "
                                               "step (a batch run twice, e.g. by a closure, counted once)")
        metrics[TOKENS_PER_S] = Metric.from_samples([tokens / s for s in steps], "tokens/s", "derived", basis=basis)
    rate = metrics.get(TOKENS_PER_S)
    if paced and rate is not None and rate.value is not None and mean > 0:
        per_step = metrics[TOKENS_PER_STEP].value or 0.0
        metrics[TOKENS_PER_S] = rate.model_copy(update={
            "value": per_step / mean, "note": "tokens a step over the mean clean step (the steps wait unevenly for "
                                              "their input: throughput follows the mean); p10-p90 of each step's own"})
    return metrics


def _accumulated(m: Measured) -> float | None:
    """Batches per optimizer step where the step ran more than one (gradient accumulation), else None."""
    batches = m.batches_per_step
    return batches if batches is not None and batches > 1.01 else None


def _micro_batches(m: Measured) -> float:
    """Batches of the observed shape per optimizer step in a user's training loop (gradient accumulation),
    by which one batch's FLOPs and bytes scale to the step's; 1 where the loop's owner described it."""
    batches = _accumulated(m)
    return 1.0 if m.known is not None or m.spec.traits.generates or batches is None else batches


def _passes_note(m: Measured) -> list[str]:
    """What one step held, when it was more than one forward and one backward on one batch."""
    return _evaluations_note(m) + _batches_note(m)


def _forward_only(m: Measured) -> bool:
    """Training steps (``prof.step()`` after each) whose forwards all ran without grad and no backward."""
    return m.spec.traits.trains and bool(m.forwards_per_step) and not m.backwards_per_step


def _evaluations_note(m: Measured) -> list[str]:
    """Clean steps that also ran the model without grad (an evaluation) or saved a checkpoint: known work in
    their time, not the training step's."""
    if _forward_only(m):
        return ["no step ran a backward: every forward of the model ran without grad (an evaluation or scoring "
                "loop, timed as steps from one prof.step() to the next): the step time and the blocks are of those "
                "forwards; the training figures (gradients, optimizer state, activations kept for backward, a "
                "training step's FLOPs and MFU) do not apply (a generation is profiled with infer=True)"]
    if m.shapes is None or not (m.shapes.evaluated or m.shapes.saved):
        return []
    n, k, total = m.shapes.evaluated, m.shapes.saved, len(m.shapes.clean)
    evaluation = "ran the model without grad (an evaluation, in the loop or a framework's between its steps)"
    said = (f"{n} of the {total} clean steps also {evaluation}" + (f", and {k} saved a checkpoint (torch.save)" if k else "")
            if n else f"{k} of the {total} clean steps also saved a checkpoint (torch.save)")
    kept = _timed(m)
    if len(kept) == len(m.timings.steps):  # every one did: there is nothing else to time
        return [f"{said}: it is in their time (a step runs from one optimizer step to the next)"]
    every = sorted(s * 1e3 for s in m.timings.steps)
    return [f"{said}: they are left out of the step time, its spread, the rates and MFU, which are the other "
            f"{len(kept)} steps' (with them, the median is {float(np.median(every)):.3g} ms and the slowest "
            f"{every[-1]:.3g} ms)"]


def _batches_note(m: Measured) -> list[str]:
    """Batches and backward passes per step, when not one each."""
    batches, bwd = _accumulated(m), m.backwards_per_step
    if batches is not None and bwd is not None and bwd < batches - 0.01:  # the forwards of one loss
        return [f"{batches:g} batches per optimizer step in {bwd:g} backward pass{'es' if bwd > 1.01 else ''} (several "
                "forwards of one loss, as a preference pair's); one step here is one optimizer step, all its "
                "batches included"]
    if batches is not None:
        return [f"gradient accumulation: {batches:g} batches per optimizer step; one step here is one optimizer "
                "step, all its micro-batches included"]
    if bwd is not None and bwd > 1.01:
        return [f"{bwd:g} backward passes per batch (a second backward on one forward, or a closure re-evaluating "
                "the loss): not gradient accumulation; the batch's tokens are counted once"]
    return []


def _infer_metrics(m: Measured, att: Attribution | None, notes: list[str]) -> dict[str, Metric]:
    gens, ms, rough, basis = m.timings.gens, 1e3, _rough(m), _basis(m)
    metrics: dict[str, Metric] = {
        TTFT: Metric.from_samples([g.prefill_s * ms for g in gens], "ms", "measured", note=rough or TTFT_SPANS,
                                  basis=basis),
        E2E_LATENCY: Metric.from_samples([g.e2e_s * ms for g in gens], "ms", "measured", note=rough or E2E_SPANS,
                                         basis=basis),
    }
    several = any(g.several_per_forward for g in gens)
    if several:  # a forward made several tokens: each generation's decode time per token it made
        decode = [sum(g.decode_s) / (g.generated - 1) * ms for g in gens if g.decode_s and g.generated > 1]
        notes.append(SEVERAL_PER_FORWARD.format(tokens=gens[-1].generated, forwards=gens[-1].forwards))
    else:
        decode = [d * ms for g in gens for d in g.decode_s]
    metrics[TPOT] = (Metric.from_samples(decode, "ms", "measured", basis=basis,
                                         note=rough or ("decode time / (tokens generated - 1), per generation"
                                                        if several else TPOT_SPANS))
                     if decode else Metric.na("ms", "one forward per generation: no decode step"))
    if m.hooked_forwards and decode:
        notes.extend(marks_note(float(np.median(decode))))
    last = gens[-1]
    if last.batch and last.prompt_len:
        metrics[PREFILL_TOKENS_PER_S] = Metric.from_samples(  # the tokens it ran: a cached prefix's are not
            [g.batch * (g.prompt_len - g.cached) / g.prefill_s for g in gens if g.batch and g.prompt_len], "tokens/s",
            "derived", basis=basis)
        if decode:
            metrics[DECODE_TOKENS_PER_S] = Metric.from_samples(
                [g.batch * (g.generated - 1) / sum(g.decode_s) for g in gens if g.decode_s and g.batch], "tokens/s",
                "derived", note="batch x tokens generated after the first / decode time", basis=basis)
        metrics[OUTPUT_TOKENS_PER_S] = Metric.from_samples(
            [g.outputs * g.generated / g.e2e_s for g in gens if g.outputs and g.generated], "tokens/s", "derived",
            note="sequences returned x tokens generated / the whole generation's time", basis=basis)
        metrics[TOTAL_TOKENS_PER_S] = Metric.from_samples(  # each request's prompt once, however many rows it ran
            [((g.prompts or g.batch) * g.prompt_len + g.outputs * g.generated) / g.e2e_s
             for g in gens if g.batch and g.prompt_len and g.outputs], "tokens/s", "derived",
            note="(prompts x prompt tokens + sequences returned x tokens generated) / the whole generation's time",
            basis=basis)
    if last.batch and (last.prompts is not None or last.returned is not None):
        notes.append(EXPANDED.format(rows=last.batch, prompts=last.prompts or last.batch, returned=last.outputs))
    _overhead(m, metrics, att)
    m.config.setdefault("new_tokens", last.generated)
    return metrics


# What lmprof's hooks marking each forward's end cost a user's generation, per forward (µs): measured with
# benchmarks/generation_overhead.py on this project's 2-core CPU (docs/user-code.md), not in the run itself.
MARK_COST_US = (45, 70)
MARK_NOTE_SHARE = 0.02  # the note is said where that cost may be this share of a token's time, or more


def marks_note(tpot_ms: float) -> list[str]:
    """What the hooks that mark each forward cost the figures, where it may matter (a short TPOT)."""
    if not (math.isfinite(tpot_ms) and tpot_ms > 0):  # a clock that did not move: no share to give (nor to divide by)
        return []
    low, high = (us / 1e3 / tpot_ms for us in MARK_COST_US)
    if high < MARK_NOTE_SHARE:
        return []
    return [f"lmprof's hooks marked each forward's end inside the generations, which costs about {MARK_COST_US[0]}-"
            f"{MARK_COST_US[1]} us a forward on a 2-core CPU (not measured in this run: "
            f"benchmarks/generation_overhead.py measures it on a machine): {100 * low:.0f}-{100 * high:.0f}% of this "
            f"TPOT of {tpot_ms:.3g} ms, by which TTFT, TPOT and the latency read slower than the loop without lmprof"]


EXPANDED = (
    "generate() ran its forwards on {rows} rows for {prompts} prompt(s) and returned {returned} sequence(s) (beam search "
    "runs num_beams rows a prompt, num_return_sequences as many): FLOPs, bytes, the KV cache and the prefill and "
    "decode throughputs are those rows'; output throughput and tokens per generation count the sequences returned")

SEVERAL_PER_FORWARD = (
    "several tokens per forward: each generation made {tokens} tokens per sequence in {forwards} forwards of the model "
    "(assisted or speculative decoding: a draft proposes tokens, the model checks them in one forward). TPOT and "
    "the decode rates count tokens made, not forwards; the decode FLOPs are the model's for those tokens, one at a "
    "time; what the draft model and the rejected tokens cost is in the time, not in the FLOPs (decode HFU n/a)")


# The timing figures of each mode: a training step's, a generation's.
_TIMINGS: dict[str, Callable[[Measured, Attribution | None, list[str]], dict[str, Metric]]] = {
    "train": _train_metrics, "infer": _infer_metrics}


def _facts(m: Measured, run: Run) -> Facts:
    """What the figures need: the loop owner's description of its workload, or what was observed."""
    known = m.known or _observed(m, run)
    return Facts(
        title=known.title, dtype=known.dtype, param_dtype=known.param_dtype, shape=known.shape,
        batch=known.batch, seq_len=known.seq_len, attention=known.attention, new_tokens=known.new_tokens,
        kv_cache=known.kv_cache, last_logits_only=known.last_logits_only, optimizer=known.optimizer,
        dropout=known.dropout, tf32=known.tf32, memory=m.memory, counted=m.flops, recomputes=m.recomputes, others=m.others,
        forward_only=_forward_only(m), master_weights=m.facts.master_weights if m.known is None else None,
        several_per_forward=any(g.several_per_forward for g in m.timings.gens),
        micro_batches=_micro_batches(m), step_shapes=m.shapes if m.known is None else None,
        generations=[(g.prefill_s, sum(g.decode_s), g.batch, g.prompt_len, g.generated) for g in m.timings.gens
                     if g.batch and g.prompt_len] if m.known is None and m.timings.first_call is None else None,
        cache_bytes=known.cache_bytes if known.cache_bytes is not None else m.cache_bytes, energy=m.energy,
        energy_steps=m.timings.clean, tokens_per_step=known.tokens_per_step, plots=m.spec.draws_plots(),
        config=m.facts.config if known.shape is None else None,  # the describer reads a model without formulas
        departs=m.facts.departs if m.known is None else None, model_params=m.facts.params if m.known is None else None,
        quantized=m.facts.quantized if m.known is None else None,
        cached_prefix=max((g.cached for g in m.timings.gens), default=0))


def _observed(m: Measured, run: Run) -> Known:
    """What a user's script did not describe, read off the model and the steps the session observed."""
    infer, facts = m.spec.traits.generates, m.facts
    params = facts.dtype or "fp32"
    # what the forwards' matmuls ran in (autocast, TF32), seen by the shapes window
    dtype, note = m.shapes.compute_dtype(params) if m.shapes is not None else (params, None)
    if note:
        run.notes.append(note)
    tf32, dtype = dtype == "tf32", "fp32" if dtype == "tf32" else dtype  # fp32 storage, TF32's peak
    if dtype != params:  # the run's dtype is the compute dtype, as lmprof train's --dtype (autocast) is
        run.config.update(dtype=dtype, param_dtype=params)
    if tf32:
        run.config["tf32"] = True
    B, T = m.input_shape if m.input_shape and len(m.input_shape) == 2 else (None, None)
    new_tokens = m.timings.gens[-1].generated if infer and m.timings.gens else 0
    outputs = m.timings.gens[-1].outputs if infer and m.timings.gens else B
    tokens = run.value(TOKENS_PER_STEP) if not infer else (outputs * new_tokens if outputs else None)
    shown = f"batch {B}, {'prompt ' if infer else 'seq '}{T}" if B else "input shape unknown"
    return Known(
        title=f"{facts.name}, {shown}, {dtype}, {m.device}", dtype=dtype, param_dtype=params, shape=facts.shape,
        batch=B, seq_len=T, attention=facts.attention, optimizer=facts.optimizer, dropout=facts.dropout,
        tokens_per_step=int(tokens) if tokens else None, new_tokens=new_tokens,
        kv_cache=not (infer and m.timings.gens and m.timings.gens[-1].recomputed),
        last_logits_only=m.timings.gens[-1].last_logits_only if infer and m.timings.gens else None, tf32=tf32)
