"""Recommendations: rules over a run's recorded figures, each citing the numbers that triggered it.

A rule looks at figures already in the :class:`~lmprof.record.run.Run` (metrics, blocks, ops) and,
optionally, facts from trace analysis. It fires only when every figure it needs is present and past
its threshold, and the :class:`Recommendation` it returns carries those figures as
:class:`Evidence` (key, value, unit, threshold, comparison). A rule whose figures are missing stays
silent: no advice without evidence.

Advice names the knob of the way the run was made (:func:`door_of`): ``lmprof train``'s and
``lmprof infer``'s flags, the Hugging Face Trainer's and Lightning's own arguments, or the line of
the user's own code for a script under ``lmprof run`` or ``lmprof.profile()``. It cites only blocks
the run has, gives phase advice on the phase that holds the time, and on a run marked noisy says
so on every recommendation that rests on its timing (a roofline "overhead-bound" label, which rests
on a block's time, is not trusted there: the block is judged by its intensity).

Thresholds are named constants (below; those of the rules on the step's parts outside the model, in
:mod:`lmprof.analysis.step_parts_advice`); docs/reports.md lists every rule with its threshold.
Pure functions: no I/O, no torch.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from lmprof import names
from lmprof.analysis.doors import door_of
from lmprof.analysis.marks import NOISY, run_marks
from lmprof.analysis.recommendation import Evidence, Recommendation, Rule, block_share
from lmprof.analysis.step_parts_advice import rule_data_share, rule_optimizer_share, rule_rollout_share
from lmprof.modes import traits
from lmprof.names import PASS_PHASES
from lmprof.record.catalogue import (
    COMPILE_PER_STEP, KV_CACHE, MBU, MFU, PEAK_BANDWIDTH, PEAK_FLOPS, PROFILER_OVERHEAD, cost_key, memory_key,
    pick,
)
from lmprof.record.run import Run

# -- thresholds (documented in docs/reports.md) -------------------------------------------------

#: Profiled vs clean step differ by more than this (%, either sign): block times are a rescaled
#: picture of a step that ran differently, so small differences between blocks are not meaningful.
PROFILER_OVERHEAD_MAX_PCT = 30.0
#: Written-out attention (scores + softmax + av) takes at least this share of the profiled step (%):
#: large enough that a fused kernel is worth trying.
ATTN_UNFUSED_MIN_PCT = 5.0
#: At least this many operator calls per step (nested calls included) ...
OVERHEAD_MIN_OPS_PER_STEP = 200
#: ... and at most this much profiled step time per operator call (µs): each call costs the host a
#: few µs of dispatch, so below ~20 µs per call dispatch is a large part of the step.
OVERHEAD_MAX_US_PER_OP = 20.0
#: On a GPU trace, the device sits idle for at least this share of the step (%): the host cannot
#: feed it fast enough.
DEVICE_IDLE_MIN_PCT = 20.0
#: The model's own top-level forward (model_glue) and the autograd engine between nodes
#: (autograd_engine) together take at least this share of the profiled step (%).
FRAMEWORK_OVERHEAD_MIN_PCT = 20.0
#: MFU below this (%) ...
LOW_MFU_PCT = 30.0
#: ... while the matmul blocks (qkv, attn.proj, mlp.fc, mlp.proj, lm_head) take at least this share
#: of the step (%): the step is dominated by work that should run near the compute peak.
MATMUL_SHARE_MIN_PCT = 40.0
#: The matmul operators (aten::mm, addmm, bmm, linear, ...) hold at most this share of the operators'
#: self time (%) for a step to be called overhead-bound from many short operators: a step whose time
#: is in matmuls is bound by those matmuls (memory or compute, as the roofline says), whatever the
#: number of operators around them.
OVERHEAD_MATMUL_OPS_MAX_PCT = 50.0
#: A phase whose matmul blocks take at least MATMUL_SHARE_MIN_PCT of it, with at least this share
#: (%) of their time in blocks the roofline calls memory-bound, is memory-bound.
MEMORY_BOUND_MIN_PCT = 50.0
#: Without a roofline table (no peak known), a matmul block below this intensity (FLOP/byte) counts
#: as memory-bound: every CPU and GPU ridge point lmprof knows lies above it.
MEMORY_BOUND_MAX_INTENSITY = 4.0
#: Phase advice (memory-bound, low MFU of a generation's prefill) only for a phase holding at least
#: this share (%) of the run's block time: advice on a phase that takes 3% of a generation can win
#: at most 3%.
PHASE_SHARE_MIN_PCT = 20.0
#: Device idle while the host waits in synchronising calls (%, from trace analysis).
SYNC_IDLE_MIN_PCT = 5.0
#: Peak memory below this share of the device's capacity (%) leaves room for a larger batch.
MEMORY_USED_MAX_PCT = 50.0
#: Fraction of device memory a suggested batch may plan to use (keeps room for fragmentation).
MEMORY_PLAN_FRACTION = 0.9
#: Clean step time spread (p90 - p10) / median above this (%): the timing is noisy.
NOISY_SPREAD_MAX_PCT = 25.0
#: torch.compile compilations per timed step after warm-up at or above this: the model recompiles
#: every step (same value as measure/compile_events.RECOMPILES_PER_STEP_FLAG, which writes the note).
RECOMPILES_PER_STEP_MIN = 0.5

UNFUSED_ATTENTION_BLOCKS = ("attn.scores", "attn.softmax", "attn.av")
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation", "aten::addbmm"})
MATMUL_BLOCKS = names.WEIGHT_MATMUL_BLOCKS
# The env key hardware/devices.py writes the device's memory capacity under (bytes).
CAPACITY_ENV_KEY = "gpu_memory_bytes"

def _narrow(run: Run) -> bool:
    """The run already computes in 16 bits (as far as its config says)."""
    return str(run.config.get("dtype") or "").lower() in ("bf16", "fp16", "bfloat16", "float16")


# -- figures the rules read --------------------------------------------------------------------


def ops_per_step(run: Run) -> int | None:
    """Operator calls per profiled step over the recorded ops (nested calls included)."""
    return sum(o.calls for o in run.ops) if run.ops else None


def median_op_us(run: Run) -> float | None:
    """Median self time per operator call (µs), each op's mean weighted by its number of calls."""
    pairs = sorted((1e3 * o.self_ms / o.calls, o.calls) for o in run.ops if o.calls > 0)
    total = sum(c for _, c in pairs)
    if not total:
        return None
    seen = 0
    for us, calls in pairs:
        seen += calls
        if seen >= total / 2:
            return us
    return pairs[-1][0]


def _profiled_step_ms(run: Run) -> float | None:
    v = run.value(pick("profiled", run.mode).name)
    if v:
        return v
    steps = (run.tables.get("attribution") or [{}])[0].get("profiled_step_ms")
    return statistics.mean(steps) if steps else None


def device_capacity(run: Run) -> tuple[str, float] | None:
    """(where it came from, bytes) of the device memory capacity, when the run recorded it."""
    capacity = run.env.model_dump().get(CAPACITY_ENV_KEY)
    return (f"env.{CAPACITY_ENV_KEY}", float(capacity)) if capacity else None


# -- the rules -----------------------------------------------------------------------------------

def rule_profiler_overhead(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Profiled steps differ from clean steps by more than PROFILER_OVERHEAD_MAX_PCT."""
    v = run.value(PROFILER_OVERHEAD)
    if v is None or abs(v) <= PROFILER_OVERHEAD_MAX_PCT:
        return None
    if v > 0:
        why = (f"Under the profiler a step took {v:.0f}% longer than a clean step. Block times are the "
               "profiled shares scaled to the clean step, but the profiler's cost is not spread evenly "
               "(it is paid per operator), so blocks made of many small ops look bigger than they are.")
    else:
        why = (f"Profiled steps were {-v:.0f}% faster than clean steps: the clean timing was disturbed "
               "(other load on the machine, frequency changes, a slow first step), so the scale applied "
               "to block times is uncertain.")
    return Recommendation(
        rule="profiler_overhead", title="Block times are not trustworthy at this profiler overhead", why=why,
        actions=("Trust the block shares (%) more than their milliseconds.",
                 f"Re-run with more timed steps and warm-up ({door_of(run).steps}) on an otherwise idle machine.",
                 "Fewer, longer steps (larger batch) reduce the per-op cost of profiling."),
        evidence=(Evidence(PROFILER_OVERHEAD, v, "%", PROFILER_OVERHEAD_MAX_PCT, "|x| >"),),
    )


def rule_attention_unfused(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Attention written out as matmul-softmax-matmul takes a sizeable share; a fused kernel exists."""
    if any(b.name == "attn.sdpa" for b in run.blocks):
        return None
    share = block_share(run, UNFUSED_ATTENTION_BLOCKS)
    if share is None or share < ATTN_UNFUSED_MIN_PCT:
        return None
    present = [n for n in UNFUSED_ATTENTION_BLOCKS if any(b.name == n for b in run.blocks)]
    action = f"Use the fused attention kernel: {door_of(run).sdpa}."
    return Recommendation(
        rule="attention_unfused", title="Attention is written out: try the fused kernel",
        why=(f"{' + '.join(present)} take {share:.1f}% of the profiled step. A fused attention kernel "
             "never writes the T x T score matrix to memory and does the three steps in one pass."),
        actions=(action, "Compare the two runs with `lmprof compare` to see the attention blocks' ratio."),
        evidence=(Evidence("blocks[" + "+".join(present) + "].pct", share, "%", ATTN_UNFUSED_MIN_PCT, ">="),),
    )


def matmul_ops_share(run: Run) -> float | None:
    """Share (%) of the recorded operators' self time in matmul operators; None without ops."""
    total = sum(o.self_ms for o in run.ops)
    if not run.ops or total <= 0:
        return None
    return 100.0 * sum(o.self_ms for o in run.ops if o.name in MATMUL_OPS) / total


@dataclass(frozen=True)
class PhaseBound:
    """How one phase's matmul blocks sit on the roofline (from run.blocks and run.tables["roofline"])."""

    phase: str
    matmul_share: float  # % of the phase's block time in matmul blocks
    memory_share: float  # % of the matmul blocks' time in memory-bound ones
    intensity: float  # FLOP/byte of the phase's matmul blocks together
    source: str  # "roofline" (lmprof's table) or "intensity" (no peak: FLOP/byte alone)
    time_share: float = 100.0  # % of the run's block time (every phase) in this phase
    blocks: tuple[str, ...] = MATMUL_BLOCKS  # the matmul blocks the phase has


def matmul_phase_share(run: Run, phases: Sequence[str]) -> float | None:
    """Share (%) of the blocks' time in ``phases`` held by matmul blocks; None without such blocks."""
    rows = [b for b in run.blocks if b.phase in phases]
    total = sum(b.time_ms for b in rows)
    if total <= 0 or not any(b.name in MATMUL_BLOCKS for b in rows):
        return None
    return 100.0 * sum(b.time_ms for b in rows if b.name in MATMUL_BLOCKS) / total


def present_matmul_blocks(run: Run, phases: Sequence[str]) -> tuple[str, ...]:
    """The matmul blocks the run has in ``phases``, in MATMUL_BLOCKS order (evidence cites only these)."""
    have = {b.name for b in run.blocks if b.phase in phases}
    return tuple(n for n in MATMUL_BLOCKS if n in have)


def phase_time_share(run: Run, phases: Sequence[str]) -> float | None:
    """Share (%) of the run's block time (every phase, the step's own parts included) in ``phases``."""
    total = sum(b.time_ms for b in run.blocks)
    return 100.0 * sum(b.time_ms for b in run.blocks if b.phase in phases) / total if total > 0 else None


def _phases(run: Run) -> list[tuple[str, ...]]:
    return [PASS_PHASES[p] for p in traits(run.mode).passes]


def _pass_key(run: Run, phase: object, key: str) -> str:
    """run.json's key of compute figure ``key`` of the pass a block phase belongs to: a training run has one
    pass (its step, forward and backward), an inference run one per phase (``prefill.mbu``, ``decode.mbu``)."""
    passes = traits(run.mode).passes
    p = passes[0] if len(passes) == 1 else str(phase)
    return cost_key(p, key) if p in passes else f"{phase}.{key}"  # a phase of no pass: a key no run has


def roofline_bound(run: Run, row: Mapping[str, Any]) -> str:
    """A roofline row's bound as far as the run's figures support it.

    "overhead-bound" says the block's measured time is far under the roof at its intensity: on a run
    marked noisy that time is not to be trusted, so the block is judged by its intensity alone against
    the ridge of the run's peaks (without them, :data:`MEMORY_BOUND_MAX_INTENSITY`), and the label
    says so. Every other label, and any label of a steady run, is the row's own.
    """
    bound = str(row.get("bound") or "unknown")
    if bound != "overhead-bound" or not run.noisy:
        return bound
    peak, bw = (run.value(_pass_key(run, row.get("phase"), k)) for k in (PEAK_FLOPS, PEAK_BANDWIDTH))
    ridge = peak / bw if peak and bw else MEMORY_BOUND_MAX_INTENSITY
    intensity = row.get("intensity")
    if not isinstance(intensity, (int, float)) or isinstance(intensity, bool):
        return f"unknown ({NOISY} run: its time cannot say overhead-bound)"
    by_intensity = "compute-bound" if intensity >= ridge else "memory-bound"
    return f"{by_intensity} (by intensity; {NOISY} run: its time cannot say overhead-bound)"


def phase_bounds(run: Run) -> list[PhaseBound]:
    """Per phase (prefill, decode; or the training step), where its matmul blocks sit on the roofline."""
    roof = {(r.get("name"), r.get("phase")): r for r in run.tables.get("roofline", [])}
    out = []
    for phases in _phases(run):
        rows = [b for b in run.blocks if b.phase in phases]
        total = sum(b.time_ms for b in rows)
        mm = [b for b in rows if b.name in MATMUL_BLOCKS and b.time_ms > 0]
        mm_ms = sum(b.time_ms for b in mm)
        if total <= 0 or mm_ms <= 0:
            continue
        with_costs = [b for b in mm if b.flops and b.bytes]
        if roof:
            memory = sum(b.time_ms for b in mm
                         if roofline_bound(run, roof.get((b.name, b.phase), {})).startswith("memory-bound"))
            source = "roofline"
        elif with_costs:
            memory = sum(b.time_ms for b in with_costs if (b.flops or 0) / (b.bytes or 1) < MEMORY_BOUND_MAX_INTENSITY)
            source = "intensity"
        else:
            continue
        flops, nbytes = sum(b.flops or 0 for b in with_costs), sum(b.bytes or 0 for b in with_costs)
        out.append(PhaseBound("+".join(phases) if len(phases) > 1 else phases[0], 100.0 * mm_ms / total,
                              100.0 * memory / mm_ms, flops / nbytes if nbytes else float("nan"), source,
                              phase_time_share(run, phases) or 0.0, present_matmul_blocks(run, phases)))
    return out


def _memory_bound_phases(run: Run) -> list[PhaseBound]:
    """Phases whose matmul blocks dominate them and wait on memory, among those holding the time."""
    return [p for p in phase_bounds(run)
            if p.matmul_share >= MATMUL_SHARE_MIN_PCT and p.memory_share >= MEMORY_BOUND_MIN_PCT
            and p.time_share >= PHASE_SHARE_MIN_PCT]


def rule_memory_bound(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Matmul blocks dominate the phase that holds the time, and lmprof's roofline puts them under the
    bandwidth roof."""
    found = _memory_bound_phases(run)
    if not found:
        return None
    p = max(found, key=lambda x: x.time_share)
    door = door_of(run)
    mbu_key = _pass_key(run, p.phase, MBU)
    mbu = run.value(mbu_key)
    what = traits(run.mode).unit
    evidence = [
        Evidence(f"{p.phase} share of the {what}'s block time", p.time_share, "%", PHASE_SHARE_MIN_PCT, ">="),
        Evidence(f"blocks[{'+'.join(p.blocks)}] share of {p.phase}", p.matmul_share, "%", MATMUL_SHARE_MIN_PCT, ">="),
        Evidence(f"roofline memory-bound share of {p.phase} matmul time" if p.source == "roofline"
                 else f"{p.phase} matmul time below {MEMORY_BOUND_MAX_INTENSITY:g} FLOP/byte", p.memory_share, "%",
                 MEMORY_BOUND_MIN_PCT, ">="),
        Evidence(f"{p.phase} matmul FLOP/byte", p.intensity, "FLOP/B", None, "present"),
    ]
    if mbu is not None:
        evidence.append(Evidence(mbu_key, mbu, "%", None, "present"))
    actions = []
    if p.phase == "decode":
        actions += [f"Decode more sequences at once ({door.batch}): each weight read from memory then serves every "
                    "sequence in the batch, so FLOP/byte grows with the batch until the step turns compute-bound "
                    "(`lmprof roofline --phase decode --sweep-batch 1,8,32,128` shows where).",
                    "Store the weights in fewer bytes"
                    + ("" if _narrow(run) else f" (bf16/fp16: {door.bf16})")
                    + ", or int8/int4 weight-only quantisation: decode time is mostly reading them "
                    "(`lmprof roofline --phase decode --weights int4`).",
                    "For long contexts keep the KV cache in lower precision (fp8/int8; `lmprof roofline --kv-dtype fp8`) "
                    "or use grouped-query attention: the cache is read in full at every token."]
    else:
        actions.append(f"Process more tokens per step ({door.batch}): FLOP/byte of the matmuls grows with the "
                       "tokens that share each weight read.")
        if not _narrow(run):
            actions.append(f"Compute in a narrower dtype ({door.bf16}) so each weight and activation moves fewer bytes.")
    actions.append("Fusing or compiling small operators will not help much here: the time is in the matmuls, "
                   "waiting on memory.")
    mbu_text = f", {mbu:.1f}% of the peak bandwidth ({mbu_key})" if mbu is not None else ""
    others = [f"{o.phase} ({o.time_share:.0f}% of the {what}) is memory-bound too" for o in found if o is not p]
    return Recommendation(
        rule="memory_bound", title=f"The {p.phase} step is memory-bound: its matmuls wait on memory",
        why=(f"The {p.phase} holds {p.time_share:.0f}% of the {what}'s time. Its matmul blocks take "
             f"{p.matmul_share:.1f}% of it at {p.intensity:.3g} FLOP/byte, and {p.memory_share:.0f}% of that time is "
             "in blocks "
             + ("lmprof's roofline puts under the bandwidth roof" if p.source == "roofline"
                else f"below {MEMORY_BOUND_MAX_INTENSITY:g} FLOP/byte (no peak known, intensity alone)")
             + f"{mbu_text}: they are limited by reading weights (and the KV cache), not by arithmetic."),
        actions=tuple(actions), evidence=tuple(evidence), notes=tuple(others),
    )


def rule_overhead_bound(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Many short operators (or an idle device): launch/dispatch overhead dominates the step."""
    door = door_of(run)
    steps = [f"Use a larger batch or longer sequences ({door.batch}) so each operator does more work."]
    if not run.config.get("compile"):
        steps.append(f"Compile the model with torch.compile ({door.compile}): torch.compile fuses small ops into fewer kernels.")
    if run.env.device.startswith("cuda") and not trace.get("graph_launches"):  # not already on CUDA graphs
        steps.append(f"CUDA graphs remove the per-launch host cost ({door.cuda_graphs}).")
    actions = tuple(steps)
    idle = trace.get("device_idle_pct")
    idle_key = "trace.device_idle_pct"
    if idle is None and run.env.device != "cpu":
        idle, idle_key = block_share(run, ("idle",), phase="step"), "blocks[idle].pct"
    if idle is not None and idle >= DEVICE_IDLE_MIN_PCT:
        return Recommendation(
            rule="overhead_bound", title="The device waits for the host: the step is overhead-bound",
            why=f"The device was idle for {idle:.1f}% of the profiled step: kernels are launched slower than they run.",
            actions=actions, evidence=(Evidence(idle_key, idle, "%", DEVICE_IDLE_MIN_PCT, ">="),),
        )
    # Many short operators alone do not make a step overhead-bound: not when its time is in matmuls
    # (they are bound by memory or compute, as the roofline says), nor when the roofline says so.
    if _memory_bound_phases(run):
        return None
    mm_share = matmul_ops_share(run)
    if mm_share is None or mm_share > OVERHEAD_MATMUL_OPS_MAX_PCT:
        return None
    # The trace counts every operator; the recorded top operators give a lower bound.
    from_trace = trace.get("ops_per_step")
    calls = from_trace if from_trace else ops_per_step(run)
    calls_key = "trace.ops_per_step" if from_trace else "ops.calls_per_step"
    step_ms = _profiled_step_ms(run)
    if not calls or not step_ms:
        return None
    us_per_op = 1e3 * step_ms / calls
    if calls < OVERHEAD_MIN_OPS_PER_STEP or us_per_op > OVERHEAD_MAX_US_PER_OP:
        return None
    evidence = [Evidence(calls_key, float(calls), "count", OVERHEAD_MIN_OPS_PER_STEP, ">="),
                Evidence(f"profiled step / {calls_key}", us_per_op, "µs", OVERHEAD_MAX_US_PER_OP, "<="),
                Evidence("ops matmul share of self time", mm_share, "%", OVERHEAD_MATMUL_OPS_MAX_PCT, "<=")]
    median = median_op_us(run)
    if median is not None:
        evidence.append(Evidence("ops.median_self_time", median, "µs", None, "present"))
    notes = () if from_trace else ("Counts cover the recorded top operators only, so the true number of calls is higher.",)
    return Recommendation(
        rule="overhead_bound", title="Many small operators: the step is overhead-bound",
        why=(f"{calls:,.0f} operator calls per profiled step leave {us_per_op:.1f} µs of step time per call, close to "
             f"what dispatching one operator costs the host, and matmuls hold only {mm_share:.0f}% of the operators' "
             "self time: the rest is many small operators."),
        actions=actions, evidence=tuple(evidence), notes=notes,
    )


def rule_framework_overhead(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """The model's own top-level Python and the autograd engine between nodes hold a large share."""
    glue = block_share(run, (names.MODEL_GLUE,)) or 0.0
    engine = block_share(run, (names.AUTOGRAD_ENGINE,)) or 0.0
    if glue + engine < FRAMEWORK_OVERHEAD_MIN_PCT:
        return None
    door = door_of(run)
    actions = [f"Use a larger batch or longer sequences ({door.batch}): this time is per call, not per token, so its "
               "share shrinks."]
    if not run.config.get("compile"):
        actions.append(f"Compile the model with torch.compile ({door.compile}): the forward's own code (mask building, position ids, "
                       "output objects) becomes part of one graph"
                       + ("; compiled autograd (torch._dynamo.config.compiled_autograd = True) does the same for "
                          "the backward's engine." if engine else "."))
    parts = [f"the model's own forward outside its modules ({names.MODEL_GLUE}) {glue:.1f}%" if glue else "",
             f"the autograd engine between backward nodes ({names.AUTOGRAD_ENGINE}) {engine:.1f}%" if engine else ""]
    what = " and ".join(p for p in parts if p)
    return Recommendation(
        rule="framework_overhead", title="Python and autograd bookkeeping take a large share of the step",
        why=f"{what[0].upper()}{what[1:]} of the profiled step: time spent around the operators, not in them.",
        actions=tuple(actions),
        evidence=(Evidence(f"blocks[{names.MODEL_GLUE}+{names.AUTOGRAD_ENGINE}].pct", glue + engine, "%",
                           FRAMEWORK_OVERHEAD_MIN_PCT, ">="),),
    )


def rule_low_mfu(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Low MFU although matmul blocks dominate the step (prefill for generation) and are not memory-bound."""
    mode = traits(run.mode)
    first = mode.passes[0]  # the training step, or the prefill
    key, phases = cost_key(first, MFU), PASS_PHASES[first]
    mfu = run.value(key)
    share = matmul_phase_share(run, phases)
    if mfu is None or share is None or mfu >= LOW_MFU_PCT or share < MATMUL_SHARE_MIN_PCT:
        return None
    if any(p.phase != "decode" for p in _memory_bound_phases(run)):
        return None  # memory-bound advice covers it: more FLOP/s cannot come from the compute side
    where = "step" if mode.trains else first
    evidence = [Evidence(key, mfu, "%", LOW_MFU_PCT, "<"),
                Evidence(f"blocks[{'+'.join(present_matmul_blocks(run, phases))}] share of {where}", share, "%",
                         MATMUL_SHARE_MIN_PCT, ">=")]
    if mode.generates:  # a prefill of a few tokens before many decode steps is not where the time goes
        held = phase_time_share(run, phases)
        if held is None or held < PHASE_SHARE_MIN_PCT:
            return None
        evidence.append(Evidence("prefill share of the generation's block time", held, "%", PHASE_SHARE_MIN_PCT, ">="))
    door = door_of(run)
    actions = [] if _narrow(run) else [f"Compute in bf16 ({door.bf16}) so matmuls run on the fast units; on fp32 "
                                       "CUDA enable TF32 (torch.backends.cuda.matmul.allow_tf32 = True)."]
    if not run.config.get("compile"):
        actions.append(f"Compile the model with torch.compile ({door.compile}) to fuse the element-wise work around the matmuls.")
    actions.append(f"Grow the batch ({door.batch}) or the model's width: small matmuls cannot fill the device.")
    return Recommendation(
        rule="low_mfu", title="Low MFU on a matmul-dominated step",
        why=(f"The matmul blocks take {share:.1f}% of the {where}, yet the model reaches {mfu:.1f}% of the device's "
             f"peak FLOP/s ({key})."),
        actions=tuple(actions), evidence=tuple(evidence),
    )


def rule_host_sync(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Trace analysis found the device idle while the host waited in synchronising calls."""
    v = trace.get("sync_idle_pct")
    if v is None or v < SYNC_IDLE_MIN_PCT:
        return None
    return Recommendation(
        rule="host_sync", title="The device idles around host synchronisations",
        why=(f"{v:.1f}% of the step the device had no work while the host sat in a synchronising call "
             "(.item(), .cpu(), printing a tensor, torch.cuda.synchronize, data-dependent shapes)."),
        actions=("Find the sync calls in the trace (cudaStreamSynchronize / cudaDeviceSynchronize) and remove "
                 "or defer them: log losses every N steps, keep metrics on the device.",
                 "Use non_blocking=True copies from pinned memory for input batches."),
        evidence=(Evidence("trace.sync_idle_pct", v, "%", SYNC_IDLE_MIN_PCT, ">="),),
    )


def rule_memory_headroom(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """Peak memory uses little of the device: a larger batch fits."""
    peak = run.value(memory_key("peak"))
    cap = device_capacity(run)
    if not peak or cap is None:
        return None
    cap_key, capacity = cap
    used = 100.0 * peak / capacity
    if used >= MEMORY_USED_MAX_PCT:
        return None
    evidence = [Evidence(memory_key("peak"), peak, "B", None, "present"),
                Evidence(cap_key, capacity, "B", None, "present"),
                Evidence("memory.peak / capacity", used, "%", MEMORY_USED_MAX_PCT, "<")]
    # Only activations (and the KV cache) grow with the batch: scale those, keep the rest fixed.
    per_batch = (run.value(memory_key("activations")) or run.value(memory_key("kv_cache"))
                 or run.value(KV_CACHE))
    batch = run.config.get("batch_size")
    suggestion = f"Increase the batch ({door_of(run).batch}) until peak memory nears the device's capacity; re-profile."
    if per_batch and isinstance(batch, int) and per_batch > 0:
        factor = (MEMORY_PLAN_FRACTION * capacity - (peak - per_batch)) / per_batch
        if factor >= 2:
            suggestion = (f"Batch {batch} could grow to about {int(batch * factor)} before planned use reaches "
                          f"{MEMORY_PLAN_FRACTION:.0%} of capacity (activations scale with the batch).")
    return Recommendation(
        rule="memory_headroom", title="Memory headroom for a larger batch",
        why=f"Peak memory is {used:.1f}% of the device's capacity.",
        actions=(suggestion, "A larger batch usually raises tokens/s until the device is saturated."),
        evidence=tuple(evidence),
    )


def rule_noisy_timing(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """The clean step (or latency) timing spreads widely between repeats."""
    key = pick("timing", run.mode).name
    m = run.metric(key)
    spread = m.spread_pct() if m is not None else None
    if m is None or spread is None or spread <= NOISY_SPREAD_MAX_PCT:
        return None
    why = (f"p10–p90 of {key} spans {spread:.0f}% of its median over {m.n} repeats: differences smaller than that "
           "between runs are not meaningful.")
    actions = (f"Run more timed steps and warm-up ({door_of(run).steps}) on an otherwise idle machine.",
               "Pin threads/clocks where you can; compare medians, not single steps.")
    return Recommendation(rule="noisy_timing", title="The timing is noisy", why=why, actions=actions,
                          evidence=(Evidence(f"{key}.spread", spread, "%", NOISY_SPREAD_MAX_PCT, ">"),))


def rule_recompiles(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """A compiled model kept compiling in the timed window: about one compilation per step or more."""
    rate = run.value(COMPILE_PER_STEP)
    if rate is None or rate < RECOMPILES_PER_STEP_MIN:
        return None
    rows = [r for r in run.tables.get("compile", []) if r.get("phase") == "measured" and r.get("reason")]
    why = f"torch.compile compiled {rate:.2g} times per timed step after warm-up, so every step pays for compilation"
    if rows:
        why += f"; the last guard that failed: {rows[-1]['reason']} (in {rows[-1].get('function', '?')})"
    return Recommendation(
        rule="recompiles", title="The compiled model recompiles every step", why=why + ".",
        actions=("Keep shapes and Python values the model sees fixed between steps (pad to a fixed length, "
                 "pass changing integers as tensors), or compile with dynamic=True.",
                 "See every compilation and its reason in run.json tables.compile; "
                 "TORCH_LOGS=recompiles prints them as they happen."),
        evidence=(Evidence(COMPILE_PER_STEP, rate, "compilations/step", RECOMPILES_PER_STEP_MIN, ">="),),
    )


RULES: tuple[Rule, ...] = (
    rule_profiler_overhead,
    rule_noisy_timing,
    rule_attention_unfused,
    rule_memory_bound,
    rule_overhead_bound,
    rule_framework_overhead,
    rule_low_mfu,
    rule_host_sync,
    rule_optimizer_share,
    rule_data_share,
    rule_rollout_share,
    rule_memory_headroom,
    rule_recompiles,
)


# Rules whose evidence rests on the run's timing (block shares, times per call, MFU, idle time): on a
# run marked noisy each says so. The others are about the noise itself, memory or compilations.
TIMING_RULES = frozenset({"attention_unfused", "memory_bound", "overhead_bound", "framework_overhead", "low_mfu",
                          "host_sync", "optimizer_share", "data_share", "rollout_share"})


def advise(run: Run, trace: Mapping[str, float] | None = None) -> list[Recommendation]:
    """Every recommendation whose rule fires on ``run``, in rule order.

    ``trace`` holds optional figures from trace analysis: ``device_idle_pct`` and ``sync_idle_pct``
    (percent of the device timeline) and ``ops_per_step`` (every CPU operator call per profiled
    step). Rules needing a figure that is absent do not fire. On a run marked noisy (or timed on
    its first calls only) every recommendation of :data:`TIMING_RULES` carries a note saying so.
    """
    facts = dict(trace or {})
    caveats = run_marks(run)
    out = []
    for rule in RULES:
        rec = rule(run, facts)
        if rec is not None:
            # Guard the contract: a recommendation without evidence is a bug in its rule.
            assert rec.evidence, f"rule {rec.rule} fired without evidence"
            if caveats and rec.rule in TIMING_RULES:
                rec = replace(rec, title=f"{rec.title} (on {'; '.join(c.split(':', 1)[0] for c in caveats)} timings)",
                              notes=(*rec.notes, *(f"This run's timings are not clean ({c}): the figures behind this "
                                                   "advice rest on them; confirm on a clean run before acting on it."
                                                   for c in caveats)))
            # Every recommendation names the figures it rests on, in its own text too.
            rests = "; ".join(e.describe() for e in rec.evidence)
            out.append(replace(rec, why=f"{rec.why} (rests on: {rests})"))
    return out
