"""What if this model ran on that device? The analytic roofline behind ``lmprof roofline``: nothing runs.

A :class:`RooflineQuery` (checked when it is made) names the model, the device, the phase and the
shapes; :func:`roofline_what_if` resolves the model's shape and the device's ceilings and returns a
:class:`RooflineAnswer`: per-block costs and roofline points at one batch size, or the phase's
roofline at each batch of a sweep. Ceilings come from the peak table, or for this machine's own
device (cpu, cuda, mps) from the table or the ``lmprof calibrate`` cache; FLOPs and bytes from
:mod:`lmprof.estimate.flops`, the roofline from :mod:`lmprof.estimate.roofline`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lmprof.estimate.facts import SOURCE_NOTES, BlockRow, ModelFacts
from lmprof.estimate.flops import BlockCost, FlopConventions, block_costs, phase_costs
from lmprof.estimate.memory import ATTENTIONS, Attention
from lmprof.estimate.models import ModelEntry
from lmprof.estimate.roofline import PhaseRoofline, RooflinePoint, phase_roofline
from lmprof.config import choice
from lmprof.dtypes import dtype_bytes, normalize_dtype, normalize_weight_dtype, weight_bytes_per_param
from lmprof.errors import ConfigError, DeviceError
from lmprof.hardware.calibrate import Peak, resolve_peak
from lmprof.hardware.peaks import PeakTable
from lmprof.names import PASS_PHASES
from lmprof.estimate.shape import ModelShape

Phase = Literal["prefill", "decode", "train"]
PHASES: tuple[Phase, ...] = ("prefill", "decode", "train")
# How the describer counts (lmprof.measure.model_facts), printed with its figures.
DESCRIBER_CONVENTIONS = [
    "FLOPs: torch's FlopCounterMode formulas over the ops the model runs on the meta device, as a CPU runs them "
    "(fused attention's backward recomputes the scores: 2.5 x its forward; masked scores are not subtracted)",
    "multiply-add = 2 FLOPs; non-matmul work (norms, activations, scans' elementwise ops) counted as 0",
    "prefill logits: every position (the model's own forward); decode: one token through the model's own cache",
    "bytes: every tensor each op reads or writes (one kernel per op, eager), weights once per block and pass, "
    "the cache's reads apart; scaled to --dtype, --weights and --kv-dtype from the dtype the model was built in",
]
# Device names that mean "this machine's device", resolved through torch and the calibration cache.
LOCAL_DEVICES = ("cpu", "cuda", "mps", "auto")
_MAX_SIZE = 2**31  # beyond any device: the figures would be nonsense


@dataclass(frozen=True)
class RooflineQuery:
    """One what-if question; sizes and names are checked on creation (ConfigError)."""

    device: str | None
    preset: str = "gpt2"
    model: str | None = None  # a known model, a config.json or a model folder (replaces preset)
    phase: str | None = None  # default: prefill, decode with a batch sweep
    dtype: str = "bf16"
    batch_size: int = 1
    seq_len: int | None = None  # default: the model's block size (2,048 at most for --model)
    context: int | None = None  # keys attended; default: seq_len
    weights: str | None = None  # weight storage dtype; default: dtype
    kv_dtype: str | None = None  # default: dtype
    sweep_batches: tuple[int, ...] | None = None
    attention: str = "math"  # math or sdpa (refused when the costs are counted, as block_costs does)
    causal: bool = False
    checkpointing: bool = False
    n_layer: int | None = None  # preset overrides
    n_head: int | None = None
    n_embd: int | None = None
    allow_generic: bool = False  # a family the describer cannot build: a generic guess, marked (never silently)

    def __post_init__(self) -> None:
        if not self.device:
            raise ConfigError("--device is required: a short name such as h100 (see --list-devices), or cpu/cuda/mps")
        if self.phase is not None and self.phase not in PHASES:
            raise ConfigError(f"unknown phase {self.phase!r}: use one of {', '.join(PHASES)}")
        if self.batch_size <= 0:
            raise ConfigError(f"--batch-size must be positive, got {self.batch_size}")
        for name, value in (("--batch-size", self.batch_size), ("--seq-len", self.seq_len),
                            ("--n-layer", self.n_layer), ("--n-head", self.n_head), ("--n-embd", self.n_embd)):
            if value is not None and not 0 < value < _MAX_SIZE:
                raise ConfigError(f"{name} must be between 1 and {_MAX_SIZE - 1:,}")


@dataclass(frozen=True)
class DeviceCeilings:
    """The device a what-if runs on and its ceilings for the compute dtype."""

    name: str  # table key, or torch's device name for a local device
    kind: str  # cpu, cuda, mps, ...
    label: str  # the name a person reads
    peak: Peak  # where the ceilings came from
    flops_per_s: float | None  # the compute ceiling for the dtype (None: not known, see peak.note)
    bytes_per_s: float | None  # the bandwidth ceiling (None: not known)

    @property
    def known(self) -> bool:
        """Both ceilings known: blocks get a bound and a roofline time, and there is a plot."""
        return bool(self.flops_per_s and self.bytes_per_s)


@dataclass(frozen=True)
class RooflineAnswer:
    """The roofline of one phase of a model on a device, at one batch size or a sweep of them."""

    query: RooflineQuery
    model: str  # the preset or the resolved model's name
    shape: ModelShape | None  # lmprof's description (formula, generic); None: read off the model (``facts``)
    device: DeviceCeilings
    dtype: str  # the compute dtype, normalised
    phase: Phase
    seq_len: int  # tokens per sequence (decode: the KV length the step sees)
    kv_len: int  # keys attended
    conventions: FlopConventions
    costs: tuple[BlockCost, ...] = ()  # at query.batch_size; empty for a sweep
    result: PhaseRoofline | None = None  # at query.batch_size; None for a sweep
    sweep: tuple[PhaseRoofline, ...] = ()  # one per query.sweep_batches
    source: str = "formula"  # where the figures come from: formula, model (the describer) or generic
    entry: ModelEntry | None = None  # the resolved --model (None for a preset)
    facts: ModelFacts | None = None  # what the describer read at query.batch_size (source "model")

    @property
    def source_note(self) -> str:
        return SOURCE_NOTES[self.source]

    @property
    def params(self) -> tuple[int, int]:
        """(total, active per token) parameters."""
        if self.shape is not None:
            return self.shape.n_params(), self.shape.n_params(active=True)
        assert self.facts is not None
        return self.facts.params, self.facts.params_active

    def summary(self) -> str:
        """The model in a few words: parameters (active), layers, width, heads or mixers, vocabulary."""
        total, active = self.params
        head = f"{total / 1e6:.1f}M params" + (f", {active / 1e6:.1f}M active" if active != total else "")
        if self.shape is not None:
            s = self.shape
            return f"{head}, L={s.n_layer}, d={s.n_embd}, heads={s.n_head}, V={s.vocab_size}"
        assert self.facts is not None
        f = self.facts
        kinds = ", ".join(f"{k} x{f.layer_kinds.count(k)}" for k in dict.fromkeys(f.layer_kinds))
        return f"{head}, L={f.n_layer} ({kinds}), d={f.hidden}, V={f.vocab}"

    def conventions_lines(self) -> list[str]:
        """How the figures are counted, one line each."""
        if self.source != "model":
            return self.conventions.describe().splitlines()
        return DESCRIBER_CONVENTIONS

    @property
    def points(self) -> tuple[RooflinePoint, ...]:
        """The blocks' roofline points at query.batch_size (empty for a sweep)."""
        return self.result.points if self.result is not None else ()

    def _finish(self) -> RooflineAnswer:
        """The answer with its costs at the query's batch, or its sweep."""
        q, device = self.query, self.device

        def at(batch: int) -> tuple[list[BlockCost], PhaseRoofline]:
            costs = phase_block_costs(self, batch)
            tokens = batch * (1 if self.phase == "decode" else self.seq_len)
            return costs, phase_roofline(costs, batch, tokens, device.flops_per_s, device.bytes_per_s)

        if q.sweep_batches:
            return replace(self, sweep=tuple(at(b)[1] for b in q.sweep_batches))
        costs, result = at(q.batch_size)
        return replace(self, costs=tuple(costs), result=result)

    @property
    def compute_bound_from_batch(self) -> int | None:
        """The first batch of the sweep whose phase is compute-bound; None if none is."""
        return next((r.batch for r in self.sweep if r.bound == "compute-bound"), None)


def roofline_what_if(query: RooflineQuery, table: PeakTable) -> RooflineAnswer:
    """The analytic roofline of ``query`` with ceilings from ``table`` (or the calibration cache)."""
    dt = normalize_dtype(query.dtype)
    if query.weights is not None:
        normalize_weight_dtype(query.weights)
    if query.kv_dtype is not None:
        normalize_dtype(query.kv_dtype)
    name, entry, shape, default_t = _model(query)
    phase: Phase = _phase(query.phase or ("decode" if query.sweep_batches else "prefill"))
    context = query.context
    t = query.seq_len if query.seq_len is not None else (
        context if (context is not None and phase == "decode") else default_t)
    if t <= 0:
        raise ConfigError(f"--seq-len must be positive, got {t}")
    kv_len = context if context is not None else t
    limit = shape.block_size if shape is not None else _positions(entry)
    _check_lengths(query, phase, limit, t, kv_len)
    # A sweep needs the ceilings (time per token); one batch's FLOP/byte table does not.
    device = _ceilings(query.device or "", dt, table, need=bool(query.sweep_batches))
    conventions = FlopConventions(causal_attention=query.causal,
                                  prefill_logits="last" if query.model is None else "all")
    weights = query.weights
    if weights and weights.lower() in ("int8", "int4") and dt not in ("bf16", "fp16", "fp32", "tf32"):
        raise ConfigError(f"--weights {weights} dequantises into --dtype; use bf16 or fp16, got {dt}")
    answer = RooflineAnswer(query, name, shape, device, dt, phase, t, kv_len, conventions,
                            source=entry.figures if entry is not None else "formula", entry=entry)
    if shape is None:
        if query.causal or query.checkpointing:
            raise ConfigError(f"--{'causal' if query.causal else 'checkpointing'} applies to lmprof's formulas; "
                              f"{name}'s figures are read off the model (what it runs)")
        entry2, facts = _describe(answer, query.batch_size)
        if facts is None:  # the describer could not: the generic guess the user asked for
            assert entry2 is not None and entry2.shape is not None
            answer = replace(answer, shape=entry2.shape, source="generic", entry=entry2)
        else:
            answer = replace(answer, facts=facts)
    return answer._finish()


def _positions(entry: ModelEntry | None) -> int:
    from lmprof.estimate.models import config_positions

    return config_positions(entry.config or {} if entry is not None else {}, default=2**27)


def _build_dtype(dt: str) -> str:
    """The dtype the describer builds a model in for a compute dtype (bytes are scaled from it)."""
    return {"fp32": "fp32", "tf32": "fp32", "fp64": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "bf16"}[dt]


def _describe(answer: RooflineAnswer, batch: int) -> tuple[ModelEntry | None, ModelFacts | None]:
    """The describer's facts of the answer's phase at ``batch`` (or the generic entry when allowed)."""
    from lmprof.measure.model_facts.resolve import describe_entry

    assert answer.entry is not None
    q, phase = answer.query, answer.phase
    entry, facts = describe_entry(
        answer.entry, allow_generic=q.allow_generic, batch=batch, seq_len=1 if phase == "decode" else answer.seq_len,
        context=answer.kv_len, dtype=_build_dtype(answer.dtype), phases=(phase,), memory=False,
        attention="eager" if _attention(q.attention) == "math" else "sdpa")
    return entry, facts


def _row_cost(r: BlockRow, answer: RooflineAnswer, built: str) -> BlockCost:
    """A describer row as a block cost, its bytes scaled from the dtype built to the query's plan."""
    q, width = answer.query, dtype_bytes(built)
    act = dtype_bytes(answer.dtype) / width
    wt = weight_bytes_per_param(q.weights if q.weights is not None else answer.dtype) / width
    kv = dtype_bytes(q.kv_dtype if q.kv_dtype is not None else answer.dtype) / width
    return BlockCost(name=r.name, phase=r.phase, matmul_flops=r.flops, other_flops=0.0,
                     weight_bytes=r.weight_bytes * wt, act_bytes=r.act_bytes * act, kv_bytes=r.kv_bytes * kv,
                     count=r.count)


def phase_block_costs(answer: RooflineAnswer, batch: int) -> list[BlockCost]:
    """Block costs of the answer's phase: decode is ONE step at KV length kv_len (the cache after appending)."""
    q, shape, dt, conv = answer.query, answer.shape, answer.dtype, answer.conventions
    attention = _attention(q.attention)
    if shape is None:  # read off the model at this batch
        facts = answer.facts if answer.facts is not None and answer.facts.batch == batch else _describe(answer, batch)[1]
        assert facts is not None
        return [_row_cost(r, answer, facts.dtype) for r in facts.rows
                if r.phase in PASS_PHASES[answer.phase] and (r.flops or r.bytes)]
    if answer.phase == "train":
        return phase_costs(shape, batch=batch, seq_len=answer.seq_len, phase="train", dtype=dt,
                           attention=attention, conventions=conv, weight_dtype=q.weights, kv_dtype=q.kv_dtype,
                           checkpointing=q.checkpointing)
    one = answer.phase == "decode"  # decode: one new token per sequence
    return block_costs(shape, batch=batch, seq_len=1 if one else answer.seq_len, phase=answer.phase,
                       context=answer.kv_len, dtype=dt, attention=attention, conventions=conv,
                       weight_dtype=q.weights, kv_dtype=q.kv_dtype)


def parse_batches(text: str) -> tuple[int, ...]:
    """'1,8,64' -> (1, 8, 64); ConfigError for anything but positive integers."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--sweep-batch takes comma-separated integers, got {text!r}") from None
    if not values or any(not 0 < v < _MAX_SIZE for v in values):
        raise ConfigError(f"--sweep-batch takes integers between 1 and {_MAX_SIZE - 1:,}, got {text[:80]!r}")
    return values


def _phase(name: str) -> Phase:
    return choice(name, PHASES, f"unknown phase {name!r}: use one of {', '.join(PHASES)}")


def _attention(name: str) -> Attention:
    return choice(name, ATTENTIONS, f"attention must be 'math' or 'sdpa', got {name!r}")


def _model(query: RooflineQuery) -> tuple[str, ModelEntry | None, ModelShape | None, int]:
    """(name, entry, shape, default tokens per sequence) of the query's model or preset; shape None
    for a family the describer reads."""
    if query.model is not None:
        from lmprof.estimate.models import resolve_model

        entry = resolve_model(query.model)
        if entry.shape is None:
            return entry.name, entry, None, min(_positions(entry), 2048)
        return entry.name, entry, entry.shape, min(entry.shape.block_size, 2048)
    from lmprof.workloads.gpt_config import preset as gpt_preset

    cfg = gpt_preset(query.preset, n_layer=query.n_layer, n_head=query.n_head, n_embd=query.n_embd)
    return query.preset, None, cfg.shape(), cfg.block_size


def _check_lengths(query: RooflineQuery, phase: Phase, block_size: int, t: int, kv_len: int) -> None:
    limit = "block_size" if query.model is None else "maximum context (max_position_embeddings)"
    checks = (("--context" if query.context is not None else "--seq-len", kv_len),) if phase == "decode" else (
        ("--seq-len", t), ("--context", kv_len))
    for what, value in checks:
        if value > block_size:
            raise ConfigError(f"{what} {value} exceeds the model's {limit} {block_size}")
    if phase != "decode" and kv_len < t:
        raise ConfigError(f"--context ({kv_len}) must be at least --seq-len ({t}) for {phase}")


def _ceilings(device: str, dt: str, table: PeakTable, need: bool = True) -> DeviceCeilings:
    """The device's ceilings for ``dt``: this machine's device through torch, any other from the table;
    with ``need`` False a device without them is kept (its blocks' bound stays unknown)."""
    spec = device.strip().lower()
    if spec in LOCAL_DEVICES or spec.startswith("cuda:"):
        from lmprof.hardware.devices import resolve_device  # imports torch: only for this machine's device

        dev = resolve_device(device)
        name, kind, label = dev.name, dev.kind, dev.name
    else:
        entry = table.find(device)
        if entry is None:
            raise DeviceError(
                f"unknown device {device!r}: not in the peak table; use one of {', '.join(table.entries)} "
                "(see --list-devices for aliases), or cpu/cuda/mps with `lmprof calibrate`, "
                "or add it to ~/.config/lmprof/peaks.yaml"
            )
        name, kind, label = entry.key, entry.kind, entry.name
    peak = resolve_peak(name, kind, dt, table=table)
    if need and (not peak.flops_per_s or not peak.bytes_per_s):
        raise DeviceError(f"no {dt} roofline for {label}: {peak.note}")
    return DeviceCeilings(name, kind, label, peak, peak.flops_per_s, peak.bytes_per_s)
