"""The metric catalogue: every figure lmprof writes into run.json, in one typed table.

Each :class:`MetricSpec` says what a figure is (name as in run.json, unit, kind of source, how it is
computed, which modes write it, when it is written only sometimes) and how the views use it (its
label, whether a larger value is better, its place in the terminal summary, the report's headline
cards, ``lmprof compare`` and the sweep results view). The summary, the report, ``compare``, the
results store and docs/metrics.md all read this table instead of keeping lists of their own.

Every figure lives in run.json at ``metrics["<name>"]`` (``value``, ``unit``, ``source``, ``note``, and
``p10``/``p90``/``n`` where it is the median of repeated samples), and in a sweep's results store as
one row of the ``metrics`` table with ``key = <name>``.

Writers take each figure's name from the constants and key builders here (``STEP_TIME``,
``cost_key("prefill", MFU)``, ``memory_key("peak")``, ``energy_key("total")``), never spelling it.

``python -m lmprof.record.catalogue`` prints docs/metrics.md (``--write`` writes it).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lmprof.modes import Mode

if TYPE_CHECKING:  # only the type: the catalogue stays importable without pydantic (the sweep store reads it)
    from lmprof.record.run import Source

# == The figures' names ==============================================================================
# Every figure's name in run.json, for the code that writes (or reads) it: a writer takes the name from
# here instead of spelling it (tests/test_metric_catalogue.py checks that none spells one), and the
# table below declares each under the same name.

# -- timing and throughput (a training step; a generation) ------------------------------------------
STEP_TIME = "step_time"
TOKENS_PER_S = "tokens_per_s"
TOKENS_PER_STEP = "tokens_per_step"
TTFT = "ttft"
TPOT = "tpot"
DECODE_TOKENS_PER_S = "decode_tokens_per_s"
E2E_LATENCY = "e2e_latency"
PREFILL_TOKENS_PER_S = "prefill_tokens_per_s"
OUTPUT_TOKENS_PER_S = "output_tokens_per_s"
TOTAL_TOKENS_PER_S = "total_tokens_per_s"
PROFILED_STEP_TIME = "profiled_step_time"
PROFILED_E2E_LATENCY = "profiled_e2e_latency"
PROFILER_OVERHEAD = "profiler_overhead"
LOSS = "loss"
PARAMS = "params"

# -- distributed runs: rank 0's merged record --------------------------------------------------------
WORLD_SIZE = "world_size"
SLOWEST_RANK = "slowest_rank"
STRAGGLER = "straggler"


def global_key(key: str) -> str:
    """A rank's figure summed over every rank: ``tokens_per_s.global``."""
    return f"{key}.global"


# -- the compute figures of one pass (a training step, a prefill, the decode steps) -----------------
MFU = "mfu"
HFU = "hfu"
MBU = "mbu"
FLOPS_MODEL = "flops.model_per_step"
FLOPS_HARDWARE = "flops.hardware_per_step"
BYTES_MODEL = "bytes.model_per_step"
FLOPS_ACHIEVED = "flops.achieved"
PEAK_FLOPS = "peak.flops"
PEAK_BANDWIDTH = "peak.bandwidth"
COSTS: tuple[str, ...] = (MFU, HFU, MBU, FLOPS_MODEL, FLOPS_HARDWARE, BYTES_MODEL, FLOPS_ACHIEVED, PEAK_FLOPS,
                          PEAK_BANDWIDTH)
# The key prefix of each pass's compute figures (names.PASS_PHASES): a training step's have none.
PASS_PREFIX: dict[str, str] = {"train": "", "prefill": "prefill.", "decode": "decode."}


def cost_key(pass_: str, key: str) -> str:
    """One pass's compute figure: ``mfu`` of a training step, ``prefill.mfu``, ``decode.mbu``."""
    return PASS_PREFIX[pass_] + key


# -- memory: measured beside estimated ---------------------------------------------------------------
MEMORY_PARTS: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "kv_cache", "peak")
KV_CACHE = "kv_cache"  # the cache after a whole generation, and its estimate
KV_CACHE_ESTIMATED = "kv_cache.estimated"


def memory_key(part: str, estimated: bool = False) -> str:
    """``memory.<part>`` (measured) or ``memory.estimated.<part>``, a part of :data:`MEMORY_PARTS`."""
    if part not in MEMORY_PARTS:
        raise KeyError(f"no memory figure {part!r}")
    return f"memory.estimated.{part}" if estimated else f"memory.{part}"


# -- energy over the clean window: measured, or estimated (rated power x time) ------------------------
ENERGY_PARTS: tuple[str, ...] = ("total", "window", "power.avg", "power.idle", "above_idle", "per_step",
                                 "per_generation", "per_token", "per_generated_token", "flop_per_joule")


def energy_key(part: str, estimated: bool = False) -> str:
    """``energy.<part>`` or ``energy.estimated.<part>``; ``domain.<name>`` for one meter domain."""
    if part not in ENERGY_PARTS and not (part.startswith("domain.") and len(part) > len("domain.")):
        raise KeyError(f"no energy figure {part!r}")
    return f"energy.estimated.{part}" if estimated else f"energy.{part}"


# -- torch.compile ---------------------------------------------------------------------------------------
COMPILE_TIME = "compile.time"
COMPILE_DYNAMO_TIME = "compile.dynamo_time"
COMPILE_COMPILATIONS = "compile.compilations"
COMPILE_RECOMPILES = "compile.recompiles"
COMPILE_GRAPH_BREAKS = "compile.graph_breaks"
COMPILE_AFTER_WARMUP = "compile.after_warmup"
COMPILE_PER_STEP = "compile.per_step"

# -- sweeps -------------------------------------------------------------------------------------------
NOISY = "noisy"  # the results store's row of run.json's top-level `noisy`


#: The group a figure is shown in by ``compare`` and the report's sections.
Group = Literal["headline", "compute", "memory", "energy", "other"]
#: The part a figure plays in the runs of its modes, one figure per mode (:func:`pick`): the clean timing of
#: one step or generation, the profiled one, the throughput, the throughput summed over ranks.
Role = Literal["timing", "profiled", "throughput", "global_throughput"]

TRAIN: tuple[Mode, ...] = ("train",)
INFER: tuple[Mode, ...] = ("infer",)
BOTH: tuple[Mode, ...] = ("train", "infer")

# Conditions shared by many entries (said once, in the words the docs print).
ENERGY = "a readable energy meter (RAPL, NVML, Apple); --energy auto (the default) writes only energy.total " \
         "and the domains, n/a with the reason, when none is readable"
METERED = "--energy auto (the default): n/a with the reason when no meter is readable"
ESTIMATED_ENERGY = "--energy estimate (rated power x time, a model, not a measurement)"
COMPILED = "--compile (torch.compile)"
DISTRIBUTED = "a distributed run (--nproc > 1, torchrun): rank 0's merged record"
DESCRIBED = "a model lmprof has formulas for (the built-in GPT or a described Hugging Face family)"
MEM_ESTIMATE = f"{DESCRIBED}; training also needs optimizer adamw or sgd"
COUNTED = "FlopCounterMode counted the step (a model lmprof has no formulas for, in lmprof run or the callbacks)"
CALIBRATED = "the peak comes from `lmprof calibrate` on this machine"
BW_MEASURED = "the bandwidth comes from `lmprof calibrate` or a CPU run's quick check on this machine"


@dataclass(frozen=True)
class MetricSpec:
    """One figure of run.json.

    ``name`` with a ``<part>`` in it is a family (``energy.domain.<domain>``): every key that starts
    with the text before ``<`` belongs to it. ``kind`` is the usual source; ``also`` lists the other
    sources the figure may carry and ``also_when`` says when. ``condition`` is None when every run of
    its ``modes`` writes the figure (perhaps as n/a with the reason), else it says when it is written.
    The view ranks (``summary``, ``card``, ``compare``, ``view``) order the figures a view shows; None
    keeps the figure out of that view (run.json and the report's "All figures" still have it).
    Entries with the same ``card`` rank are alternatives: the first the run has is shown.
    """

    name: str
    unit: str
    kind: Source
    label: str
    how: str
    modes: tuple[Mode, ...]
    group: Group
    higher_is_better: bool | None
    also: tuple[Source, ...] = ()
    also_when: str = ""
    spread: bool = False  # the median of repeated samples: p10, p90 and n are set
    # Rests on a measured time, so a noisy run's noise and a first-call timing hold for it too
    # (analysis/marks.py); None: as ``spread`` says (every figure with a spread is a timing).
    timed: bool | None = None
    condition: str | None = None
    summary: int | None = None  # rank in the terminal summary's figures table
    card: int | None = None  # rank among the report's headline cards
    compare: int | None = None  # rank among compare's first rows
    view: int | None = None  # rank among the columns of the results store's SQL view `results`
    results_header: str | None = None  # header in `lmprof results`' terminal table (view figures only)
    na_reason_from: str | None = None  # the figure whose n/a note says why this one is absent
    best: str | None = None  # a sweep report's "best configuration" criterion (figures sharing it: first found wins)
    best_rank: int | None = None  # that criterion's place among the sweep report's criteria
    headline: int | None = None  # rank as the one figure shown beside a finished sweep point
    role: Role | None = None  # the part it plays in its modes' runs (pick)

    @property
    def family(self) -> bool:
        """True for a pattern entry such as ``energy.domain.<domain>``."""
        return "<" in self.name

    @property
    def rests_on_time(self) -> bool:
        """Whether the figure is (or is computed from) a measured time: a timing, throughput, utilisation,
        energy over the timed window. Sizes, counts, estimates and peaks are not."""
        return self.spread if self.timed is None else self.timed

    @property
    def sources(self) -> tuple[Source, ...]:
        """Every source the figure may carry, the usual one first."""
        return (self.kind, *self.also)

    @property
    def column(self) -> str:
        """The figure's column in ``load_results`` and the SQL view (``step_time`` -> ``step_time_ms``)."""
        return metric_column(self.name, self.unit)

    def matches(self, key: str) -> bool:
        """Whether run.json's ``key`` is this figure (a family matches every key under its prefix)."""
        if not self.family:
            return key == self.name
        prefix = self.name.split("<", 1)[0]
        return key.startswith(prefix) and len(key) > len(prefix)


FASTEST = "fastest (tokens/s)"


def _m(name: str, unit: str, kind: Source, label: str, how: str, modes: tuple[Mode, ...], group: Group,
       higher: bool | None, **kw: object) -> MetricSpec:
    return MetricSpec(name, unit, kind, label, how, modes, group, higher, **kw)  # type: ignore[arg-type]


def _costs(pass_: str, modes: tuple[Mode, ...], what: str, ranks: dict[str, dict[str, object]]) -> list[MetricSpec]:
    """FLOPs, bytes, peaks and utilisations of one step (train, no prefix) or one inference phase."""
    prefix = PASS_PREFIX[pass_].rstrip(".")
    r = ranks
    return [
        _m(cost_key(pass_, MFU), "%", "derived", f"{prefix + ' ' if prefix else ''}MFU",
           f"model FLOPs per {what} / time / peak FLOP/s; n/a above 100% (the peak is then no ceiling)",
           modes, "compute", True, condition=f"{DESCRIBED}, or {COUNTED}", timed=True, **r.get(MFU, {})),
        _m(cost_key(pass_, HFU), "%", "derived", f"{prefix + ' ' if prefix else ''}HFU",
           f"hardware FLOPs per {what} (what ran: with a recomputation's, such as activation checkpointing or "
           "decode without a KV cache) / time / peak FLOP/s", modes, "compute", True,
           condition=f"{DESCRIBED}, or {COUNTED}", timed=True, **r.get(HFU, {})),
        _m(cost_key(pass_, MBU), "%", "derived",
           f"{prefix} bandwidth use (MBU)" if prefix else "MBU",
           f"minimum bytes per {what} / time / peak bandwidth; n/a for counted FLOPs (no byte count)",
           modes, "compute", True, condition=f"{DESCRIBED}, or {COUNTED}", timed=True, **r.get(MBU, {})),
        _m(cost_key(pass_, FLOPS_MODEL), "FLOP", "estimated", f"{prefix or 'step'} model FLOPs",
           f"FLOPs the model mathematically needs per {what} (PaLM's 6N + 12·L·d·T per training token; "
           "see docs/flops-and-roofline.md)", modes, "compute", None, also=("measured",), also_when=COUNTED,
           condition=f"{DESCRIBED}, or {COUNTED}", **r.get(FLOPS_MODEL, {})),
        _m(cost_key(pass_, FLOPS_HARDWARE), "FLOP", "estimated", f"{prefix or 'step'} hardware FLOPs",
           f"model FLOPs per {what} plus activation recomputation (equal to the model FLOPs without it)",
           modes, "compute", None, also=("measured",), also_when=COUNTED, condition=f"{DESCRIBED}, or {COUNTED}"),
        _m(cost_key(pass_, BYTES_MODEL), "B", "estimated", f"{prefix or 'step'} minimum bytes",
           f"minimum bytes moved per {what}: the sum over blocks at the compute dtype's width", modes, "compute",
           None, condition=DESCRIBED),
        _m(cost_key(pass_, FLOPS_ACHIEVED), "FLOP/s", "derived", f"{prefix or 'step'} achieved FLOP/s",
           f"model FLOPs per {what} / its measured time", modes, "compute", True,
           condition=f"{DESCRIBED}, or {COUNTED}", timed=True, **r.get(FLOPS_ACHIEVED, {})),
        _m(cost_key(pass_, PEAK_FLOPS), "FLOP/s", "estimated", "device peak FLOP/s",
           "the device's peak at the compute dtype: the peak table, CPU cores x clock, or a calibration",
           modes, "compute", None, also=("measured",), also_when=CALIBRATED,
           condition=f"{DESCRIBED}, or {COUNTED}", **r.get(PEAK_FLOPS, {})),
        _m(cost_key(pass_, PEAK_BANDWIDTH), "B/s", "estimated", "device peak bandwidth",
           "the device's peak memory bandwidth: the peak table, a calibration, or (CPU) a quick copy check the "
           "run measured on the fly", modes, "compute", None, also=("measured",), also_when=BW_MEASURED,
           condition=DESCRIBED),
    ]


def _energy(estimated: bool) -> list[MetricSpec]:
    """The energy figures of one window: measured (``energy.*``) or estimated (``energy.estimated.*``)."""
    def e(part: str) -> str:
        return energy_key(part, estimated)

    meas: Source = "estimated" if estimated else "measured"
    der: Source = "estimated" if estimated else "derived"
    cond = ESTIMATED_ENERGY if estimated else ENERGY
    est = " (estimated)" if estimated else ""
    # Summary ranks: measured figures 320..360, estimated ones 370..380 (the summary shows fewer of them).
    out = [
        _m(e("total"), "J", meas, f"energy{est}", "all counted domains over the clean window (idle included)",
           BOTH, "energy", False, condition=METERED if not estimated else cond, summary=370 if estimated else 320),
    ]
    if not estimated:
        out.append(_m(e("window"), "s", "measured", "energy window", "length of the metered window", BOTH,
                      "energy", False, condition=cond))
    card = {"card": 90, "na_reason_from": e("total")}
    out += [
        _m(e("power.avg"), "W", der, f"average power{est}", "total / window", BOTH, "energy", False,
           condition=cond, **({} if estimated else {"summary": 350})),
        _m(e("power.idle"), "W", meas, f"idle power{est}", "idle baseline of the same domains, before the run",
           BOTH, "energy", False, condition=cond),
        _m(e("above_idle"), "J", der, f"energy above idle{est}", "total - idle power x window", BOTH, "energy",
           False, condition=cond),
        _m(e("per_step"), "J/step", der, f"energy per step{est}", "total / timed steps", TRAIN, "energy",
           False, condition=cond, **({} if estimated else {"summary": 330})),
        _m(e("per_generation"), "J/generation", der, f"energy per generation{est}", "total / timed generations",
           INFER, "energy", False, condition=cond, **({} if estimated else {"summary": 331})),
        _m(e("per_token"), "J/token", der, f"energy per token{est}", "total / tokens trained in the window",
           TRAIN, "energy", False, condition=cond, summary=380 if estimated else 340, **card,
           best="best energy per token", best_rank=70,
           **({} if estimated else {"view": 110, "results_header": "J/token"})),
        _m(e("per_generated_token"), "J/generated token", der, f"energy per generated token{est}",
           "total / tokens generated in the window", INFER, "energy", False, condition=cond,
           summary=381 if estimated else 341, **card),
        _m(e("flop_per_joule"), "FLOP/J", der, f"FLOP per joule{est}", "model FLOPs in the window / total "
           "(= FLOP/s per W)", BOTH, "energy", True, condition=f"{cond}; and a FLOP count",
           **({} if estimated else {"summary": 360, "view": 120})),
        _m(e("domain.<domain>"), "J", meas, f"energy of one domain{est}",
           "one meter domain over the window (e.g. energy.domain.gpu:0, energy.domain.cpu)", BOTH, "energy",
           False, condition=METERED if not estimated else cond),
    ]
    # Metered over the timed window (or rated power x its time): all but the idle baseline rest on that time.
    return [replace(m, timed=not m.name.endswith(".power.idle")) for m in out]


_TRAIN_COSTS: dict[str, dict[str, object]] = {
    FLOPS_ACHIEVED: {"summary": 120, "compare": 130}, PEAK_FLOPS: {"summary": 130},
    MFU: {"summary": 80, "card": 50, "compare": 100, "view": 90, "results_header": "mfu %", "best": "best MFU",
          "best_rank": 50},
    HFU: {"summary": 82, "compare": 110}, MBU: {"compare": 120}}

CATALOGUE: tuple[MetricSpec, ...] = (
    # -- timing and throughput -------------------------------------------------------------------
    _m(STEP_TIME, "ms", "measured", "step time (clean median)",
       "median of the clean (profiler-free) steps, optimizer step to optimizer step, device synchronised; a "
       "user's loop's steps that also ran an evaluation or saved a checkpoint are left out",
       TRAIN, "headline", False, spread=True, summary=10, card=10, compare=10, view=10, results_header="step ms",
       best="lowest step time", best_rank=20, headline=30, role="timing"),
    _m(TOKENS_PER_S, "tokens/s", "derived", "throughput", "tokens per step / each clean step's time (median)",
       TRAIN, "headline", True, spread=True, condition="lmprof run: needs the model's input shape",
       summary=20, card=20, compare=20, view=20, results_header="tok/s", best=FASTEST, best_rank=10, headline=10,
       role="throughput"),
    _m(TOKENS_PER_STEP, "tokens", "derived", "tokens per step",
       "batch x sequence length (x backward passes per step with gradient accumulation)", TRAIN, "other", None,
       condition="lmprof run: needs the model's input shape"),
    _m(TTFT, "ms", "measured", "time to first token",
       "median over the clean generations of the prefill (prompt forward and the first token's choice)",
       INFER, "headline", False, spread=True, summary=30, card=10, compare=50, view=30, results_header="ttft ms",
       best="lowest time to first token", best_rank=30),
    _m(TPOT, "ms", "measured", "time per output token",
       "median of every decode step's time (one forward after the first); n/a with one new token",
       INFER, "headline", False, spread=True, summary=40, card=20, compare=60, view=40, results_header="tpot ms",
       best="lowest time per output token", best_rank=40),
    _m(DECODE_TOKENS_PER_S, "tokens/s", "derived", "decode throughput",
       "batch x decode steps / decode time, per clean generation (median)", INFER, "headline", True, spread=True,
       condition="more than one new token", summary=50, card=30, compare=70, view=50,
       results_header="decode tok/s", best=FASTEST, best_rank=10, headline=20, role="throughput"),
    _m(E2E_LATENCY, "ms", "measured", "end-to-end latency", "median of the clean generations, whole generate call",
       INFER, "headline", False, spread=True, summary=60, card=40, compare=90, view=60, headline=40, role="timing"),
    _m(PREFILL_TOKENS_PER_S, "tokens/s", "derived", "prefill throughput",
       "batch x prompt tokens / prefill time, per clean generation (median)", INFER, "headline", True, spread=True,
       condition="lmprof run: needs the prompt's shape", summary=70, compare=80),
    _m(OUTPUT_TOKENS_PER_S, "tokens/s", "derived", "output throughput",
       "batch x tokens generated / the whole generation's time (its prefill included), per clean generation "
       "(median): what a server's users receive per second, where decode throughput leaves the prefill out",
       INFER, "headline", True, spread=True, condition="lmprof run: needs the prompt's shape", summary=65,
       compare=95),
    _m(TOTAL_TOKENS_PER_S, "tokens/s", "derived", "total token throughput",
       "(prompts x prompt tokens + sequences returned x tokens generated) / the whole generation's time, per clean "
       "generation (median): a serving benchmark's total token throughput (vLLM's), each request's prompt counted "
       "once (its padding included) however many rows beam search or several returned sequences ran",
       INFER, "headline", True, spread=True, condition="lmprof run: needs the prompt's shape", summary=67,
       compare=96),
    # -- compute: the training step, then the two inference phases --------------------------------
    *_costs("train", TRAIN, "training step", _TRAIN_COSTS),
    *_costs("prefill", INFER, "prefill", {MFU: {"summary": 90, "card": 50}}),
    *_costs("decode", INFER, "decode phase (every decode step of a generation)",
            {MFU: {"summary": 100}, HFU: {"summary": 105}, MBU: {"summary": 110, "card": 60}}),
    # -- the profiler and the workload -------------------------------------------------------------
    _m(PROFILED_STEP_TIME, "ms", "measured", "profiled step time", "median of the steps run under torch.profiler",
       TRAIN, "headline", False, spread=True, summary=140, compare=30, role="profiled"),
    _m(PROFILED_E2E_LATENCY, "ms", "measured", "profiled generation latency",
       "median of the generations run under torch.profiler", INFER, "headline", False, spread=True, summary=150,
       role="profiled"),
    _m(PROFILER_OVERHEAD, "%", "derived", "profiler overhead",
       "(profiled median - clean median) / clean median; n/a when no clean time was taken", BOTH, "headline",
       None, timed=True, summary=160, card=100, compare=40),
    _m(LOSS, "nats/token", "measured", "loss", "the training loss of the last profiled step", TRAIN, "headline",
       None, condition="lmprof train (the step returns its loss)", summary=170, card=110, compare=140, view=80),
    _m(PARAMS, "count", "measured", "parameters", "sum of numel over model.parameters()", BOTH, "headline", None,
       condition="lmprof run: needs the model", summary=180, compare=150, view=70),
    # -- distributed --------------------------------------------------------------------------------
    _m(WORLD_SIZE, "count", "measured", "ranks", "number of ranks that ran", BOTH, "other", None,
       condition=DISTRIBUTED, summary=190),
    _m(SLOWEST_RANK, "rank", "measured", "slowest rank", "rank with the highest median clean step (generation)",
       BOTH, "other", None, condition=DISTRIBUTED, summary=200, timed=True),
    _m(STRAGGLER, "%", "derived", "straggler gap",
       "(slowest rank's median - fastest rank's) / fastest rank's", BOTH, "other", None,
       condition=DISTRIBUTED, summary=210, timed=True),
    _m(global_key(TOKENS_PER_S), "tokens/s", "derived", "global throughput",
       "sum over ranks of each rank's tokens_per_s", TRAIN, "other", True, condition=DISTRIBUTED, summary=220,
       timed=True, role="global_throughput"),
    _m(global_key(DECODE_TOKENS_PER_S), "tokens/s", "derived", "global decode throughput",
       "sum over ranks of each rank's decode_tokens_per_s", INFER, "other", True, condition=DISTRIBUTED, summary=230,
       timed=True, role="global_throughput"),
    # -- memory -------------------------------------------------------------------------------------
    _m(memory_key("peak"), "B", "measured", "peak memory",
       "peak allocated bytes of one warm-up step (CUDA allocator; on CPU model bytes + the step's net allocations)",
       BOTH, "memory", False, condition="lmprof run: needs a warm-up step lmprof saw begin", summary=240, card=70,
       view=100, results_header="peak mem", best="lowest peak memory", best_rank=60),
    _m(memory_key("peak", estimated=True), "B", "estimated", "estimated peak memory",
       "lmprof's memory model (docs/memory.md)", BOTH, "memory", False, condition=MEM_ESTIMATE, summary=250),
    _m(memory_key("params"), "B", "measured", "parameter memory", "bytes of the parameters, storages counted once",
       BOTH, "memory", False, condition="lmprof run: needs a warm-up step lmprof saw begin", summary=260),
    _m(memory_key("params", estimated=True), "B", "estimated", "estimated parameter memory",
       "parameters x dtype width", BOTH, "memory", False, condition=MEM_ESTIMATE),
    _m(memory_key("grads"), "B", "measured", "gradient memory", "bytes of every .grad after backward", TRAIN, "memory",
       False, condition="lmprof run: needs a warm-up step lmprof saw begin", summary=270),
    _m(memory_key("grads", estimated=True), "B", "estimated", "estimated gradient memory",
       "trainable parameters x grad width", TRAIN, "memory", False, condition=MEM_ESTIMATE),
    _m(memory_key("optimizer"), "B", "measured", "optimizer state memory", "bytes of the optimizer.state tensors",
       TRAIN, "memory", False, condition="lmprof run: needs a warm-up step lmprof saw begin", summary=280),
    _m(memory_key("optimizer", estimated=True), "B", "estimated", "estimated optimizer state memory",
       "the optimizer's state per parameter (two fp32 moments for AdamW)", TRAIN, "memory", False,
       condition=MEM_ESTIMATE),
    _m(memory_key("activations"), "B", "measured", "activation memory",
       "bytes the forward pass allocated and still holds at its end", TRAIN, "memory", False,
       condition="lmprof run: needs a warm-up step lmprof saw begin", summary=290),
    _m(memory_key("activations", estimated=True), "B", "estimated", "estimated activation memory",
       "tensors saved for backward (Korthikanti et al. 2022, adapted) plus held logits", TRAIN, "memory", False,
       condition=MEM_ESTIMATE),
    _m(memory_key("kv_cache"), "B", "measured", "KV cache memory", "bytes of the KV cache tensors", INFER, "memory",
       False, condition="lmprof run: needs a warm-up generation lmprof saw begin", summary=300),
    _m(memory_key("kv_cache", estimated=True), "B", "estimated", "estimated KV cache memory",
       "2 x layers x kv_heads x head_dim x tokens x batch x width", INFER, "memory", False, condition=MEM_ESTIMATE),
    _m(KV_CACHE, "B", "measured", "KV cache", "bytes of the cache tensors after a whole generation", INFER,
       "memory", False, condition="a cache object lmprof can read (the built-in GPT, Hugging Face caches)",
       summary=310, card=80),
    _m(KV_CACHE_ESTIMATED, "B", "estimated", "estimated KV cache",
       "2 x layers x kv_heads x head_dim x (prompt + new tokens - 1) x batch x bytes (0 without a cache)", INFER,
       "memory", False, condition=DESCRIBED),
    # -- energy -------------------------------------------------------------------------------------
    *_energy(estimated=False),
    *_energy(estimated=True),
    # -- compilation ----------------------------------------------------------------------------------
    _m(COMPILE_TIME, "ms", "measured", "first call (compilation included)",
       "the first step or generation by stopwatch, compilation included", BOTH, "other", False,
       condition=f"{COMPILED}, with at least one warm-up step", summary=390, timed=True),
    _m(COMPILE_DYNAMO_TIME, "ms", "measured", "dynamo compile time",
       "sum of dynamo's own compile time over every frame and backward graph", BOTH, "other", False,
       condition=COMPILED, summary=400, timed=True),
    _m(COMPILE_COMPILATIONS, "count", "measured", "compilations", "frames compiled, backward graphs included",
       BOTH, "other", None, condition=COMPILED),
    _m(COMPILE_RECOMPILES, "count", "measured", "recompilations", "compilations caused by a failed guard", BOTH,
       "other", None, condition=COMPILED, summary=410),
    _m(COMPILE_GRAPH_BREAKS, "count", "measured", "graph breaks", "distinct places the graph is split", BOTH,
       "other", None, condition=COMPILED, summary=420),
    _m(COMPILE_AFTER_WARMUP, "count", "measured", "compilations after warm-up",
       "compilations in the measured and profiled windows", BOTH, "other", None, condition=COMPILED),
    _m(COMPILE_PER_STEP, "compilations/step", "derived", "compilations per step",
       "forward compilations per timed call after warm-up", BOTH, "other", None,
       condition=f"{COMPILED}, with timed calls after warm-up"),
    # -- sweeps ---------------------------------------------------------------------------------------
    _m(NOISY, "flag", "derived", "noisy run", "1 when the run's timing is not to be trusted as it stands "
       "(run.json's top-level `noisy`; the note joins its `noise` reasons)", BOTH, "other", None,
       condition="the sweep results store only: run.json keeps it as the top-level `noisy` field", view=130),
)

_BY_NAME = {m.name: m for m in CATALOGUE}
_FAMILIES = tuple(m for m in CATALOGUE if m.family)


def lookup(key: str) -> MetricSpec | None:
    """The catalogue entry of run.json's metric ``key`` (a family's for ``energy.domain.gpu:0``); None if unknown."""
    hit = _BY_NAME.get(key)
    if hit is not None:
        return hit
    # The longest prefix first: energy.estimated.domain.x belongs to the estimated family.
    for m in sorted(_FAMILIES, key=lambda m: -len(m.name)):
        if m.matches(key):
            return m
    return None


def ranked(view: Literal["summary", "card", "compare", "view"], mode: Mode | None = None) -> list[MetricSpec]:
    """The entries a view shows, in its order (``mode``: only those that mode writes)."""
    picked = [m for m in CATALOGUE if getattr(m, view) is not None and (mode is None or mode in m.modes)]
    return sorted(picked, key=lambda m: getattr(m, view))


def best_criteria() -> list[tuple[str, list[MetricSpec]]]:
    """A sweep report's "best configuration" criteria in order: (title, the figures that answer it)."""
    found: dict[str, list[MetricSpec]] = {}
    for m in sorted((m for m in CATALOGUE if m.best), key=lambda m: m.best_rank or 0):
        found.setdefault(str(m.best), []).append(m)
    return list(found.items())


_ROLES: dict[tuple[str, str], MetricSpec] = {(m.role, mode): m for m in CATALOGUE if m.role is not None
                                              for mode in m.modes}


def pick(role: Role, mode: str) -> MetricSpec:
    """The figure that plays ``role`` in runs of ``mode``: the clean timing is ``step_time`` in training,
    ``e2e_latency`` in inference; the throughput ``tokens_per_s``, ``decode_tokens_per_s``."""
    return _ROLES[role, mode]


def throughput(mode: Mode) -> MetricSpec:
    """The throughput figure a sweep plots for ``mode`` (the "fastest" criterion's figure for that mode)."""
    return pick("throughput", mode)


def headlines() -> list[MetricSpec]:
    """The figures shown beside a finished sweep point, best first (the first the run has is shown)."""
    return sorted((m for m in CATALOGUE if m.headline is not None), key=lambda m: m.headline or 0)


def group_of(key: str) -> Group:
    """The group of a figure; one the catalogue does not know goes by its name's prefix."""
    spec = lookup(key)
    if spec is not None:
        return spec.group
    if key.startswith(("memory.", "kv_cache")):
        return "memory"
    if key.startswith("energy."):
        return "energy"
    if key.startswith(("flops.", "peak.", "bytes.")):
        return "compute"
    return "other"


def in_catalogue_order(keys: list[str]) -> list[str]:
    """``keys`` with known figures first, in catalogue order, then unknown ones as given."""
    rank = {m.name: i for i, m in enumerate(CATALOGUE)}

    def pos(k: str) -> int:
        spec = lookup(k)
        return rank[spec.name] if spec is not None else len(rank)

    return sorted(keys, key=pos)  # sorted is stable: a family's keys and unknown keys keep their order


# -- the results store's column names -------------------------------------------------------------

# Metric column suffix by unit: step_time (ms) -> step_time_ms, mfu (%) -> mfu_pct.
_UNIT_SUFFIX = {
    "ms": "ms", "s": "s", "%": "pct", "B": "bytes", "B/s": "bytes_per_s", "J": "j", "W": "w",
    "FLOP": "flop", "FLOP/s": "flop_per_s",
}


def metric_column(key: str, unit: str) -> str:
    """Column name of a metric: dots become underscores, plus a unit suffix where the unit is not in the name.

    ``step_time`` (ms) -> ``step_time_ms``; ``mfu`` (%) -> ``mfu_pct``; ``memory.peak`` (B) ->
    ``memory_peak_bytes``; ``tokens_per_s`` (tokens/s) stays; ``energy.per_token`` (J/token) ->
    ``energy_per_token_j``.
    """
    base = re.sub(r"[^0-9a-zA-Z]+", "_", key).strip("_").lower()
    suffix = _UNIT_SUFFIX.get(unit)
    if suffix is None and unit.startswith("J/"):
        suffix = "j"
    if suffix is None or base.endswith("_" + suffix):
        return base
    return f"{base}_{suffix}"


# -- docs/metrics.md ---------------------------------------------------------------------------------

DOC_PATH = Path("docs") / "metrics.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _ranks(m: MetricSpec) -> str:
    parts = [f"summary {m.summary}" if m.summary is not None else "",
             f"card {m.card}" if m.card is not None else "",
             f"compare {m.compare}" if m.compare is not None else "",
             f"view {m.view}" if m.view is not None else ""]
    return ", ".join(p for p in parts if p)


_GROUP_TITLES = {"headline": "Timing, throughput and the workload", "compute": "FLOPs, peaks and utilisation",
                 "memory": "Memory", "energy": "Energy", "other": "Distributed runs, compilation and sweeps"}


def markdown() -> str:
    """docs/metrics.md, generated from :data:`CATALOGUE` (tests check the checked-in file equals it)."""
    lines = [
        "# Metrics",
        "",
        "<!-- generated by `python -m lmprof.record.catalogue --write` from src/lmprof/record/catalogue.py;"
        " do not edit -->",
        "",
        "Every figure lmprof writes into run.json, from one table in the code (`lmprof.record.catalogue`) that",
        "the terminal summary, the report, `lmprof compare`, the sweep results store and this page all read.",
        "",
        "Where a figure is kept: run.json `metrics[\"<name>\"]` holds `value`, `unit`, `source` and `note`",
        "(`value` null and the note saying why when the figure cannot be taken here), plus `p10`, `p90` and `n`",
        "for a figure marked *spread* (the median of repeated samples). A sweep's `results.sqlite` has one row",
        "per figure in its `metrics` table (`key` = the name) and the figures with a view rank as columns of",
        "the view `results`; `load_results` names every figure's column as in the *column* field.",
        "",
        "- **kind**: `measured` (a clock or counter), `estimated` (a formula or model) or `derived` (arithmetic",
        "  on measured figures); a second kind, when given, applies under the stated condition.",
        "- **modes**: which runs write it; **written**: *always* (perhaps n/a with the reason) or the condition;",
        "  *lmprof run: needs ...* means `lmprof train`/`infer` always write it and `lmprof run` (and the",
        "  callbacks) when it could see what is named.",
        "- **better**: which direction `lmprof compare` colours as an improvement (blank: neither).",
        "- **views**: its rank in the terminal summary, the report's headline cards (one card per rank: the",
        "  first figure of that rank the run has), `compare`'s first rows and the results view.",
        "- `prefill.*` and `decode.*` are the inference phases' versions of the training step's compute",
        "  figures; `energy.estimated.*` are `--energy estimate`'s versions of the measured energy figures.",
        "",
    ]
    for group, title in _GROUP_TITLES.items():
        lines += [f"## {title}", "",
                  "| name | unit | kind | modes | label | how it is computed | written | better | views | column |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m in CATALOGUE:
            if m.group != group:
                continue
            kind = m.kind + (" (spread)" if m.spread else "")
            if m.also:
                kind += f"; {'/'.join(m.also)} when {m.also_when}"
            better = {True: "higher", False: "lower", None: ""}[m.higher_is_better]
            lines.append("| " + " | ".join(_cell(x) for x in (
                f"`{m.name}`", f"`{m.unit}`", kind, "/".join(m.modes), m.label, m.how, m.condition or "always",
                better, _ranks(m), f"`{m.column}`")) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print docs/metrics.md; ``--write [PATH]`` writes it (default: docs/metrics.md under the current folder)."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = markdown()
    if args and args[0] == "--write":
        path = Path(args[1]) if len(args) > 1 else DOC_PATH
        from lmprof.atomic import write_text

        write_text(path, text)
        print(f"wrote {path}")
        return 0
    if args and args[0] not in ("--markdown",):
        print("usage: python -m lmprof.record.catalogue [--markdown | --write [PATH]]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
