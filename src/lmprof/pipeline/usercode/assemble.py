"""A session's measurements as the same Run record, folder and summary as ``lmprof train`` / ``infer``."""
from __future__ import annotations

import sys
from typing import Any

import torch

from lmprof.analysis.block_truth import mark_uncertain
from lmprof.measure.profiling import ProfiledPhase, op_table
from lmprof.measure.window import compress, drop_partial
from lmprof.pipeline.protocol import add_compile_report, assemble_run, mark_noise, overhead_metrics
from lmprof.workloads.hf import config_dict
from lmprof.pipeline.figures import CountedFlops, Facts, add_figures
from lmprof.pipeline.usercode.session import Known
from lmprof.record.run import Metric, Run
from lmprof.trace.attribution import Attribution, attribute
from lmprof.trace.load import load_trace
from lmprof.workloads.describe import attention_path, dropout_of
from lmprof.workloads.hf_interface import attention_implementation


def _attribution(session: Any, profiled: ProfiledPhase | None) -> Attribution | None:
    if profiled is None:
        return None
    if not profiled.steps:
        compress(profiled, session.folder / "trace.json.gz")
        return None
    table = load_trace(profiled.trace_path)  # the plain file: read faster than the .gz
    compress(profiled, session.folder / "trace.json.gz")
    drop_partial(table, profiled.steps)
    table.cache.clear()
    profiled.ops = op_table(table, profiled.steps)
    att = attribute(table, compiled=session.watch.kernel_graphs() if session.watch is not None else ())
    return att if att.steps else None


def _dtype(model: torch.nn.Module | None) -> str | None:
    p = next(model.parameters(), None) if model is not None else None
    if p is None:
        return None
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(p.dtype, str(p.dtype))


def _config(session: Any) -> dict[str, Any]:
    if session.spec.driven:  # lmprof train / infer: the validated options and what the model turned out to be
        return dict(session.spec.config)
    model = session.model
    cfg: dict[str, Any] = {"source": "user code", "model_name": _model_name(model), "steps": session.steps,
                           "warmup": session.warmup, "profile_steps": session.profile_steps,
                           "device_resolved": str(session.device), "compile": session.compiled}
    if model is not None:
        cfg["dtype"] = _dtype(model)
        mt = getattr(getattr(model, "config", None), "model_type", None)
        if mt:
            cfg["model_type"] = mt
        impl = attention_implementation(model)
        if impl:
            cfg["attention"] = impl
    if session.optimizers:
        cfg["optimizer"] = type(session.optimizers[0]).__name__.lower()
    if session.input_shape and len(session.input_shape) == 2:
        cfg["batch_size"], cfg["seq_len"] = session.input_shape
    cfg.update(session.spec.config)
    return cfg


def _model_name(model: torch.nn.Module | None) -> str:
    if model is None:
        return "unknown model"
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return name if name else type(model).__name__


def _common(session: Any, metrics: dict[str, Metric], att: Attribution | None, clean_ms: float,
            profiled: ProfiledPhase | None, notes: list[str]) -> Run:
    assert session.folder is not None and session.device is not None
    if session.model is not None:
        metrics["params"] = Metric(value=sum(p.numel() for p in session.model.parameters()), unit="count",
                                   source="measured")
    empty = Attribution(0, [], [], "cpu")
    phase = profiled if (profiled is not None and att is not None) else ProfiledPhase(session.folder / "trace.json.gz", [], 0)
    run = assemble_run(session.spec.mode, session.device, session.folder, _config(session), metrics, att or empty,
                       clean_ms, phase, notes, None)
    if session.noise_window is not None:
        samples = ([g.e2e_s * 1e3 for g in session.gens] if session.spec.mode == "infer"
                   else [s * 1e3 for s in session.samples])
        before, after = session.noise_window
        mark_noise(run, samples, "generation" if session.spec.mode == "infer" else "step", before, after,
                   session.device.kind)
    if session.stopwatch is not None:
        run.blocks = mark_uncertain(run.blocks, session.stopwatch)
    if att is None:
        run.tables.pop("attribution", None)
        if not (session.folder / "trace.json.gz").is_file():
            run.files.pop("trace", None)
    add_compile_report(run, session.watch, session.folder)
    session.watch = None
    add_figures(run, session.folder, _facts(session, run))
    return run


def _facts(session: Any, run: Run) -> Facts:
    """What the figures need, from what the session observed of the user's model and steps."""
    model = session.model
    infer = session.spec.mode == "infer"
    step = session.figures_step.result() if session.figures_step is not None else None
    shape = session._shape() if model is not None else None  # noqa: SLF001 - looked up once, in the session
    counted = None
    where = f"warm-up {'generation' if infer else 'step'} {session.flops_at}, before the timed windows"
    if session.flops_counted:  # counted on a step of its own (training only)
        counted = CountedFlops(where=where, step=session.flops_counted)
    elif step is not None and step.flops:
        counted = (CountedFlops(where=where, prefill=step.prefill_flops,
                                decode=step.flops - step.prefill_flops if step.prefill_flops else None)
                   if infer else CountedFlops(where=where, step=step.flops))
    elif session.flops_gave_way:
        pass  # the session said why already (your own profiler ran in the counting step)
    elif shape is None and not session.compiled and session.flops_apart:
        run.notes.append(f"no FLOP count: it is taken on warm-up step {session.flops_at} (apart from the figures "
                         "step, so that the profile has no FlopCounterMode in it), and this run ended before that step did")
    elif shape is None and not session.compiled:
        run.notes.append("no FLOP count: it is taken on a warm-up step, and this run had "
                         f"{'none' if session.warmup == 0 else 'none lmprof saw begin'} (raise --warmup)")
    elif shape is None:
        run.notes.append("no FLOP count for a compiled model lmprof has no formulas for "
                         "(FlopCounterMode would recompile it)")
    if step is not None and step.memory is None and session.figures_step.memory_error:
        run.notes.append(f"no memory measurement: the figures step's recording could not be read back "
                         f"({session.figures_step.memory_error})")
    if step is None and not session.figures_gave_way:  # else the session said why
        run.notes.append("no memory measurement: it is taken on a warm-up step, and this run had none "
                         "lmprof saw begin (raise --warmup)")
    known = session.known or _observed(session, run)  # lmprof train / infer describe their workload
    return Facts(
        title=known.title, dtype=known.dtype, param_dtype=known.param_dtype, shape=known.shape,
        batch=known.batch, seq_len=known.seq_len, attention=known.attention, new_tokens=known.new_tokens,
        kv_cache=known.kv_cache, optimizer=known.optimizer, dropout=known.dropout,
        memory=step.memory if step else None, counted=counted,
        cache_bytes=known.cache_bytes if known.cache_bytes is not None else (step.cache_bytes if step else None),
        energy=session.energy, energy_steps=len(session.gens) if infer else len(session.samples),
        tokens_per_step=known.tokens_per_step, plots=session.spec.draws_plots(),
        config=config_dict(model) if known.shape is None else None)  # for the describer (lmprof issue 45)


def _observed(session: Any, run: Run) -> Known:
    """What a user's script did not describe, read off the model and the steps the session observed."""
    model = session.model
    infer = session.spec.mode == "infer"
    dtype = _dtype(model) or "fp32"
    B, T = session.input_shape if session.input_shape and len(session.input_shape) == 2 else (None, None)
    new_tokens = session.gens[-1].forwards if infer and session.gens else 0
    tokens = run.value("tokens_per_step") if not infer else (B * new_tokens if B else None)
    shown = f"batch {B}, {'prompt ' if infer else 'seq '}{T}" if B else "input shape unknown"
    return Known(
        title=f"{_model_name(model)}, {shown}, {dtype}, {session.device}", dtype=dtype, param_dtype=dtype,
        shape=session._shape() if model is not None else None,  # noqa: SLF001 - looked up once, in the session
        batch=B, seq_len=T, attention=attention_path(model) if model is not None else "math",
        optimizer=type(session.optimizers[0]).__name__.lower() if session.optimizers else None,
        dropout=dropout_of(model) if model is not None else 0.0, tokens_per_step=int(tokens) if tokens else None,
        new_tokens=new_tokens)


def _rough(session: Any) -> str | None:
    """The timing note of a run whose times are not clean ones (a script too short for the clean window)."""
    kind = session.first_call
    return f"first call: includes warm-up costs (timed {session._ROUGH[kind]}), not a clean timing" if kind else None


def _overhead(session: Any, metrics: dict[str, Metric], att: Attribution | None, clean: float, what: str) -> None:
    if att is not None:
        metrics.update(overhead_metrics(att, clean, what))
        if session.first_call:
            metrics["profiler_overhead"] = Metric.na("%", f"no clean {what} was timed to compare the profiled one with")


def assemble(session: Any, profiled: ProfiledPhase | None) -> Run:
    """The Run for a finished session (train or infer)."""
    att = _attribution(session, profiled)
    notes = list(session.notes)
    if att is None:
        notes.append("no profiled step completed: clean timing only, no block breakdown")
    if session.spec.mode == "infer":
        return _infer_run(session, att, profiled, notes)
    step_ms = [s * 1e3 for s in session.samples]
    what = ("one step: data, forward, backward, optimizer, zero_grad, device synchronized" if session.spec.driven
            else "from one optimizer step's end to the next's, device synchronized")
    metrics: dict[str, Metric] = {"step_time": Metric.from_samples(step_ms, "ms", "measured",
                                                                   note=_rough(session) or what)}
    clean = metrics["step_time"].value or 0.0
    _overhead(session, metrics, att, clean, "step")
    bwd = session.backwards_per_step
    if bwd is not None and bwd > 1.01:
        notes.append(f"gradient accumulation: {bwd:g} backward passes per optimizer step; one step here is "
                     "one optimizer step, all its micro-batches included")
    known_tokens = session.known.tokens_per_step if session.known is not None else None
    if known_tokens:
        metrics["tokens_per_step"] = Metric(value=known_tokens, unit="tokens", source="derived",
                                            note="batch x sequence length")
        metrics["tokens_per_s"] = Metric.from_samples([known_tokens / s for s in session.samples], "tokens/s",
                                                      "derived")
    elif session.input_shape and len(session.input_shape) == 2:
        fwd = session.forwards_per_step or 1.0
        tokens = session.input_shape[0] * session.input_shape[1] * round(bwd or fwd)
        metrics["tokens_per_step"] = Metric(value=tokens, unit="tokens", source="derived",
                                            note="input_ids of the model's first profiled forward x backward passes per step")
        metrics["tokens_per_s"] = Metric.from_samples([tokens / s for s in session.samples], "tokens/s", "derived")
    return _common(session, metrics, att, clean, profiled, notes)


# What each inference timing spans: lmprof's own greedy loop (driven), or the user's generate() seen by hooks.
_SPANS = {
    False: ("from generate() being called to the end of its first forward (prefill)",
            "one generate() call, device synchronized", "end of one forward to the end of the next"),
    True: ("prefill of the prompt batch and the first token's choice", "prefill and every decode step",
           "time per output token after the first, all decode steps"),
}


def _infer_run(session: Any, att: Attribution | None, profiled: ProfiledPhase | None, notes: list[str]) -> Run:
    gens = session.gens
    ms = 1e3
    ttft, e2e, tpot = _SPANS[bool(session.spec.driven)]
    metrics: dict[str, Metric] = {
        "ttft": Metric.from_samples([g.prefill_s * ms for g in gens], "ms", "measured", note=_rough(session) or ttft),
        "e2e_latency": Metric.from_samples([g.e2e_s * ms for g in gens], "ms", "measured",
                                           note=_rough(session) or e2e),
    }
    decode = [d * ms for g in gens for d in g.decode_s]
    metrics["tpot"] = (Metric.from_samples(decode, "ms", "measured", note=_rough(session) or tpot)
                       if decode else Metric.na("ms", "one forward per generation: no decode step"))
    g0 = gens[-1]
    if g0.batch and g0.prompt_len:
        metrics["prefill_tokens_per_s"] = Metric.from_samples([g.batch * g.prompt_len / g.prefill_s for g in gens],
                                                              "tokens/s", "derived")
        if decode:
            metrics["decode_tokens_per_s"] = Metric.from_samples(
                [g.batch * (g.forwards - 1) / sum(g.decode_s) for g in gens if g.decode_s], "tokens/s", "derived",
                note="batch x decode forwards / decode time")
    clean = metrics["e2e_latency"].value or 0.0
    _overhead(session, metrics, att, clean, "generation")
    session.spec.config.setdefault("new_tokens", g0.forwards)
    return _common(session, metrics, att, clean, profiled, notes)


def write(session: Any) -> None:
    """Save the run folder, write report.html and print the summary to stderr (stdout is the script's)."""
    run, folder = session.run, session.folder
    run.save(folder)
    if not session.spec.verbose:
        if session.spec.report:
            from lmprof.show.report import write_run_report

            write_run_report(run, folder)
        return
    from rich.console import Console

    from lmprof.show.summary import render

    console = Console(file=sys.stderr, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 120)
    render(run, console, folder=str(folder))
    if session.spec.report:
        from lmprof.show.report import write_run_report

        path = write_run_report(run, folder)
        console.print(f"report: {path}  (open it in a browser; the trace opens in https://ui.perfetto.dev)")
