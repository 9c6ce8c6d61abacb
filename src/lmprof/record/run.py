"""The run record: what one lmprof run measured, written once and read by everything after.

On disk a run is a folder (see docs/run-format.md)::

    run.json      schema, mode, env, config, metrics (value + unit + source), blocks, ops, notes
    blocks.csv    one row per (block, phase)
    ops.csv       top operators, like torch.profiler's key_averages table
    trace.json.gz the profiled phase, opens in Perfetto / chrome://tracing

Every number carries its unit and its source: ``measured`` (read from a clock or counter),
``estimated`` (from a model or formula) or ``derived`` (arithmetic on measured figures). A figure the
hardware cannot give has ``value=None`` and a ``note`` saying why; it is shown as ``n/a``.
"""
from __future__ import annotations

import csv
import io
import shutil
import math
import statistics
from pathlib import Path
from typing import Any, Literal, Sequence

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from lmprof import safejson
from lmprof.atomic import atomic_path, write_bytes, write_text
from lmprof.errors import DataError
from lmprof.modes import Mode

SCHEMA = "lmprof.run/1"
Source = Literal["measured", "estimated", "derived"]
# What a timing figure rests on: clean steps (device synchronized, nothing of lmprof's running, no
# profiler at all), or rough ones of a script too short for the clean window (warm-up steps, the
# figures step, lmprof's profiled steps, the very first call: the note says which). A step the user's
# own profiler ran in is neither: lmprof never times it (pipeline/protocol/giveway.py).
Basis = Literal["clean", "first_call"]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), numpy's default method, without numpy."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Part(BaseModel):
    """A part of the run record. Each refuses a key it does not know (rather than dropping it), so a
    misspelt key in a hand-made run.json, or a newer lmprof's field, is an error a reader sees.

    A field's meaning is the string under it: pydantic reads those as the field's description, and
    record/schema.py writes them into docs/run.schema.json and the field tables of docs/run-format.md,
    so the meaning of a run.json key is written once, here."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Metric(Part):
    """One figure with its unit and source. ``value`` is the median when there are samples."""

    value: float | None
    """The median when there are repeated samples; `null` means **n/a**, and `note` says why."""
    unit: str
    """Always present (`ms`, `tokens/s`, `%`, `B`, `FLOP`, `FLOP/s`, `J`, `W`, `count`, ...)."""
    source: Source
    """`measured` (read from a clock or counter), `estimated` (a model or formula), or `derived`
    (arithmetic on measured figures, e.g. tokens/s = tokens per step / step time)."""
    p10: float | None = None
    """10th percentile of the repeated measurements, when there were several."""
    p90: float | None = None
    """90th percentile of the repeated measurements, when there were several."""
    n: int | None = None
    """How many measurements the median and percentiles are of."""
    note: str | None = None
    """Why the figure is n/a; on a figure with a value, a caveat on how it was obtained."""
    basis: Basis | None = None
    """Timing figures only (`step_time`, `tokens_per_s`, `ttft`, `tpot`, `e2e_latency`, and the inference
    throughputs `prefill_tokens_per_s`, `decode_tokens_per_s`, `output_tokens_per_s`, `total_tokens_per_s`):
    what the figure rests on. `clean`: clean steps
    (nothing of lmprof's running, no profiler). `first_call`: the script was too short for a clean
    window, so the figure comes from rough steps (warm-up, the figures step, lmprof's profiled steps,
    the very first call; `note` says which). A step during which the user's own torch.profiler ran is
    never timed, so no figure rests on one. `null` on other figures, and in run.json files written
    before the field, whose first-call figures are recognised by a `note` beginning `first call`
    (`analysis/marks.py`: compare, the gate, the report and the summary read it there)."""

    @classmethod
    def na(cls, unit: str, reason: str, source: Source = "measured") -> "Metric":
        """A figure that cannot be given here, with the reason."""
        return cls(value=None, unit=unit, source=source, note=reason)

    @classmethod
    def from_samples(
        cls, samples: Sequence[float], unit: str, source: Source = "measured", note: str | None = None,
        basis: Basis | None = None,
    ) -> "Metric":
        """Median, p10 and p90 of repeated measurements (``basis``: what timed samples rest on)."""
        if not samples:
            return cls.na(unit, note or "no samples", source)
        return cls(
            basis=basis,
            value=statistics.median(samples),
            unit=unit,
            source=source,
            p10=percentile(samples, 10),
            p90=percentile(samples, 90),
            n=len(samples),
            note=note,
        )

    @property
    def available(self) -> bool:
        return self.value is not None

    def spread_pct(self) -> float | None:
        """(p90 - p10) / median, in percent: how noisy the figure is."""
        if self.value in (None, 0) or self.p10 is None or self.p90 is None:
            return None
        return 100.0 * (self.p90 - self.p10) / abs(self.value)


class Block(Part):
    """Time of one part of a step.

    ``profiled_ms`` is the mean measured under the profiler; ``time_ms`` is the block's median over
    the profiled steps, with the profiler's per-event cost taken out (CPU clock), scaled so that the
    parts add up to the clean (profiler-free) median step a user would see without lmprof watching
    (analysis/reconcile.py).
    """

    name: str
    """Canonical block (`embedding`, `ln_1`, `attn.qkv`, `attn.scores`, `attn.softmax`, `attn.av` or
    `attn.sdpa`, `attn.proj`, `residual`, `ln_2`, `moe.router`, `moe.experts`, `mlp.fc`, `mlp.act`,
    `mlp.proj`, `ln_f`, `lm_head`, `loss`), `model_glue` (models lmprof hooks: the model's own top-level
    forward outside its modules: causal-mask building, position ids and adds, output objects),
    `generate_loop` (a generation's prefill or decode outside the model's forward, where `model_glue`
    claims that forward whole: the generation loop's token choice, stopping criteria, cache bookkeeping;
    without `model_glue`, a compiled model, that time is `other`), `other_models` (forwards of models
    beside the profiled one, in the phase they ran in, or `step` between phases: a distillation teacher,
    a DPO reference or reward model, a GAN's other half, speculative decoding's assistant; each call of a
    live root module with parameters none of which are the profiled model's is one range; `lmprof run`,
    `lmprof.profile()` and the callbacks), `accumulate_grad`, `autograd_engine` (backward() outside every
    autograd node: the engine between nodes, the seed gradient), `compiled_call` (compiled runs: host
    time of calling the compiled graphs outside their kernels: dynamo's guards, AOT wrappers, the graph
    call after its last kernel; on the CPU clock the call's time before each kernel, its buffers and
    launch, is that kernel's blocks'), `other`; or a step part (`data` (lmprof's own loop's batch; in a
    user's loop, torch's `enumerate(DataLoader)#...` range around each batch its DataLoader fetches),
    `generate` (a Hugging Face `generate()` inside a training step: an RL loop's rollout, one row with
    no block inside), `grad_clip` (a user's loop: `clip_grad_norm_` / `clip_grad_value_`), `optimizer`,
    `zero_grad`, `other`, `idle`)."""
    phase: str
    """`forward`, `backward`, `step` (train); `prefill`, `decode` (infer)."""
    time_ms: float
    """Derived: the block's median over the profiled steps with the profiler's per-event cost taken out
    (CPU clock), scaled so all rows add up to the clean median step time. A block that ran in fewer than
    half of the profiled steps (an evaluation's `generate()` in one of three) has a median of nothing and
    no row; a note gives its profiled time in the steps it ran."""
    profiled_ms: float
    """Measured under the profiler, mean per profiled step."""
    pct: float
    """Share of the corrected step, %."""
    calls: int | None = None
    """Scope entries per step (forward) or autograd nodes evaluated (backward)."""
    flops: float | None = None
    """FLOPs per step, when counted (estimated)."""
    bytes: float | None = None
    """Bytes moved per step, when counted (estimated)."""
    spread_ms: float | None = None
    """p90 - p10 of the block's time over the profiled steps, on the `time_ms` scale: its uncertainty."""
    fused_ms: float | None = None
    """Derived, compiled runs only (`null` otherwise): the part of `time_ms` that came from kernels fusing
    this block with others, split by FLOPs or bytes (the shares in `tables.fused_kernels`)."""
    ops: float | None = None
    """Operators called directly in the block per step (eager: e.g. `aten::linear`, not the `aten::addmm`
    inside it; backward: one per autograd node), plus, in a compiled run, the compiled kernels it owns (a
    fused kernel counts once for each of its blocks): what `lmprof compare` sets side by side."""
    stopwatch_ms: float | None = None
    """A stopwatch around the block in a clean pass (device synchronised, no profiler), ms per step (per
    generation in inference); `null` where no stopwatch covers the block (backward, step parts, compiled
    models, user scripts; analysis/block_truth.py)."""
    uncertain: str | None = None
    """Why `time_ms` is not to be read as exact: its error against `stopwatch_ms` when outside
    attribution's goal (+-10%, matmul blocks +-5%); `null` within the goal or not checked."""


class OpStat(Part):
    """One operator's figures per profiled step: its median over the profiled steps (trace/optable.py)."""

    name: str
    """The operator (`aten::addmm`) or range name as torch.profiler names it."""
    calls: int
    """Calls per profiled step (median, rounded)."""
    self_ms: float
    """Host time in the operator itself (its children's taken out), ms per profiled step (median)."""
    total_ms: float
    """Host time in the operator and what it called, ms per profiled step (median)."""
    self_pct: float
    """`self_ms` as a share of the `self_ms` of every operator in the profiled steps, %."""
    phase: str = "step"
    """`step`: lmprof's operator table is over whole profiled steps, not split by phase."""
    device_ms: float | None = None
    """Device time of the kernels the operator launched itself, ms per profiled step (median); `null`
    when it launched none or the trace has no device."""


class Env(BaseModel):
    """Where the run happened. A key beyond these is kept, not refused: lmprof writes more facts of the
    machine than it types (``cpu_count``, and on CUDA the ``gpu_*`` facts; docs/run-format.md)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    device: str
    """The device profiled: `cpu`, `cuda:0`, `mps`."""
    device_name: str
    """The device's name as its driver gives it (the CPU model on `cpu`)."""
    torch: str
    """torch's version."""
    python: str
    """Python's version."""
    lmprof: str
    """lmprof's version."""
    os: str
    """The operating system and its release."""
    cpu: str
    """The host CPU's model name."""
    threads: int
    """torch's intra-op threads."""
    hostname: str = ""
    """The host the run ran on."""
    cuda: str | None = None
    """`torch.version.cuda` on a CUDA run (`null` elsewhere)."""
    driver: str | None = None
    """The NVIDIA driver's version (NVML) on a CUDA run; `null` elsewhere, or where NVML cannot say (a
    ROCm build). `lmprof compare` names a change of it."""


# -- the whole-run watch (run.json's ``watch``; record/watch.py has its series files) -----------------

AlertKind = Literal["drift", "spike", "memory_creep", "input_bound", "straggler"]
RequestKind = Literal["alert", "signal", "file"]


class Baseline(Part):
    """What the clean window measured, that the watched steps are judged against."""

    model_config = ConfigDict(allow_inf_nan=False)

    step_s_median: float = Field(gt=0)
    """The clean steps' median, s."""
    step_s_spread: float = Field(ge=0)
    """The clean steps' own upper spread, s: slowest clean step minus their median (the spread
    analysis/noise.py judges a profiled step with)."""
    n: int = Field(ge=1)
    """Clean steps timed."""
    memory_bytes: float | None = None
    """Memory at a clean step's end, B (allocated on CUDA, RSS on the CPU)."""
    memory_capacity_bytes: float | None = None
    """The device's memory, B, for "full in N steps"."""
    input_wait_s: float | None = None
    """The clean steps' median wait for their input, s, by the host clock as the series' `input_wait_s`
    (`null`: no forward seen, or no clean step); an `input_bound` alert's `baseline_input_wait`."""
    tokens_per_step: float | None = None
    """Tokens in a step, when known."""

    @classmethod
    def from_samples(cls, step_s: Sequence[float], **figures: Any) -> "Baseline":
        """The baseline of the clean window's step times (seconds) and its other figures."""
        xs = [float(x) for x in step_s if math.isfinite(x) and x > 0]
        if not xs:
            raise ValueError("a baseline needs at least one timed clean step")
        med = statistics.median(xs)
        return cls(step_s_median=med, step_s_spread=max(xs) - med, n=len(xs), **figures)


class WatchAlert(Part):
    """Something the detectors saw, with its step range and the figures behind it (units in each)."""

    kind: AlertKind
    """What was seen (docs/user-code.md, "Watching the whole run", says what each one means)."""
    first_step: int
    """The first step of the range it covers."""
    last_step: int
    """The last step of the range it covers."""
    message: str
    """One sentence with its figures (in a torchrun parent's merged list, starting `rank <r>:`)."""
    evidence: dict[str, Metric] = Field(default_factory=dict)
    """Name -> **Metric**: the figures behind it (e.g. `rolling_median` ms measured, `limit` ms derived,
    `rate` B/step derived, `input_share` %; in a torchrun parent, `rank`)."""
    ongoing: bool = False
    """The condition still held at the last step the detectors saw."""


class Growth(Part):
    """A block or operator that took longer in a captured window than in the baseline window."""

    kind: Literal["block", "operator"]
    """Whether `name` is a block or an operator."""
    name: str
    """The block (as `Block.name`) or operator (as `OpStat.name`)."""
    phase: str
    """Its phase (as `Block.phase`)."""
    before_ms: float
    """Per profiled step in the baseline window, ms (0: absent there)."""
    after_ms: float
    """Per profiled step in the captured window, ms."""
    delta_ms: float
    """`after_ms` - `before_ms`."""
    ratio: float | None
    """`after_ms` / `before_ms`; `null` when new."""
    status: Literal["new", "grew"]
    """`new`: absent from the baseline window; `grew`: took longer."""
    noise_ms: float
    """What a delta has to exceed to be more than noise, ms."""
    beyond_noise: bool
    """Whether `delta_ms` exceeds `noise_ms`."""


class WatchCapture(Part):
    """A window profiled by itself while the run was watched."""

    path: str
    """The child run folder, relative to the run folder: a run folder of its own, whose config has
    `capture`."""
    first_step: int
    """Its first profiled step; the step before it was the profiler's warm-up."""
    steps: int
    """Steps profiled."""
    requested_by: RequestKind
    """`alert`, `signal` (SIGUSR2) or `file` (the request file)."""
    alert: int | None = None
    """Index into the section's `alerts` of the alert that asked for it, or `null`."""
    grew: list[Growth] = Field(default_factory=list)
    """What grew against the baseline window, largest first."""
    note: str | None = None
    """Why the capture has no comparison with the run's profiled window, when it has none."""


class WatchSection(Part):
    """run.json's ``watch``: the series files, the baseline, the alerts and the captures."""

    series: list[str] = Field(default_factory=list)
    """The chunk files, relative to the run folder, in step order (`watch/series-00001.parquet`, ...)."""
    steps: int = 0
    """Steps recorded."""
    first_step: int | None = None
    """The first watched step's index (counted from the session's first step boundary)."""
    last_step: int | None = None
    """The last watched step's index."""
    baseline: Baseline | None = None
    """What the steps were judged against."""
    device_time: str | None = None
    """`null` when CUDA events gave `device_s`; else why it is n/a (`n/a: a CPU run has no device clock
    apart from the host clock`)."""
    alerts: list[WatchAlert] = Field(default_factory=list)
    """What the detectors saw (at most 50 kept per kind)."""
    alerts_dropped: dict[str, int] = Field(default_factory=dict)
    """Kind -> alerts beyond the 50 kept per kind."""
    captures: list[WatchCapture] = Field(default_factory=list)
    """The windows profiled by themselves while the run was watched."""
    notes: list[str] = Field(default_factory=list)
    """What the watch could not do or left out (memory read every N steps, device time n/a for the last
    steps, the steps left out of the series, refused capture requests, a capture dropped, a full disk or
    a failure that stopped it)."""


class Run(Part):
    """A complete run record. ``save`` writes the folder; ``load`` reads it back."""

    model_config = ConfigDict(populate_by_name=True)

    schema_: str = Field(default=SCHEMA, alias="schema")
    """`lmprof.run/1`; the number changes when a field changes meaning."""
    id: str
    """The folder name."""
    mode: Mode
    """What was profiled."""
    created: str
    """When, ISO-8601 UTC."""
    env: Env
    """Where the run happened."""
    config: dict[str, Any]
    """Every option of the run as validated, plus `model` (the resolved model config) and `seq_len`."""
    metrics: dict[str, Metric] = Field(default_factory=dict)
    """Figure name -> **Metric**; every name is listed in [metrics.md](metrics.md)."""
    blocks: list[Block] = Field(default_factory=list)
    """**Block** rows, the same as blocks.csv."""
    ops: list[OpStat] = Field(default_factory=list)
    """**OpStat** rows, the same as ops.csv."""
    tables: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """Named tables (lists of row objects): `attribution`, `memory`, `memory_measured`, `roofline`,
    `energy`, `compile`, `fused_kernels`, `generation`, `ranks`; docs/run-format.md says each one's keys."""
    notes: list[str] = Field(default_factory=list)
    """Caveats that apply to this run (e.g. compiled model: coarse attribution)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Role -> file name inside the folder (`trace`, `blocks`, `ops`, plots)."""
    noisy: bool = False
    """The timing is not to be trusted as it stands: other processes kept cores busy, the clean steps
    spread more than 1.25x (p90/p10; leading steps still warming up are a note instead, docs/reports.md;
    steps on a steady trend are said as one, with its line), a profiled step was much slower than the
    clean steps plus the profiler's measured cost (beyond the clean steps' own spread), the profiled
    window was clearly faster than the clean steps (below their own spread), or, with one or two profiled
    steps, one instance of a block repeated in every layer far exceeded the others (rules in
    `analysis/noise.py`, docs/reports.md)."""
    noise: list[str] = Field(default_factory=list)
    """One sentence per reason, with the figure behind it (empty when `noisy` is false)."""
    watch: WatchSection | None = None
    """Watched runs only: the whole-run watch (series files, baseline, alerts, captures). A run
    that was not watched has no `watch` key at all, and records written before the watch existed load as
    they are."""
    # Where the run's files (trace, plots) were written, so save() elsewhere can bring them along.
    _folder: Path | None = PrivateAttr(default=None)

    @property
    def folder(self) -> Path | None:
        return self._folder

    def metric(self, key: str) -> Metric | None:
        return self.metrics.get(key)

    def value(self, key: str) -> float | None:
        m = self.metrics.get(key)
        return None if m is None else m.value

    # -- persistence -------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write run.json, blocks.csv and ops.csv into ``folder`` (created if missing)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        if self._folder is not None and self._folder.resolve() != out.resolve():
            for name in [*self.files.values(), *(self.watch.series if self.watch is not None else [])]:
                if Path(name).is_absolute() or ".." in Path(name).parts:
                    continue  # a record names files inside its folder; anything else is not brought along
                src = self._folder / name
                if src.is_file() and not (out / name).exists():
                    with atomic_path(out / name) as tmp:
                        shutil.copy2(src, tmp)
        self._folder = out
        self.files.setdefault("blocks", "blocks.csv")
        self.files.setdefault("ops", "ops.csv")
        data = self.model_dump(mode="json", by_alias=True)
        if self.watch is None:
            del data["watch"]  # an unwatched run's run.json stays as it was before the watch existed
        # The CSVs first, run.json last: a folder with a run.json is a complete run.
        _write_csv(out / "blocks.csv", [b.model_dump() for b in self.blocks], list(Block.model_fields))
        _write_csv(out / "ops.csv", [o.model_dump() for o in self.ops], list(OpStat.model_fields))
        write_bytes(out / "run.json", orjson.dumps(data, option=orjson.OPT_INDENT_2))
        return out

    @classmethod
    def load(cls, folder: str | Path) -> "Run":
        """Read a run folder (or its run.json) written by :meth:`save`."""
        path = Path(folder)
        if path.is_dir():
            path = path / "run.json"
        if not path.is_file():
            raise DataError(f"no run record at {path}" + (" (not a regular file)" if path.exists() else ""))
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            data = safejson.loads(raw)
        except safejson.JSONError as exc:
            raise DataError(f"{path}: {' '.join(str(exc).split())[:240]}") from None
        if not isinstance(data, dict):
            raise DataError(f"{path} is not an lmprof run record: expected a JSON object, got {_json_kind(data)}")
        schema = data.get("schema", "")
        if not str(schema).startswith("lmprof.run/"):
            raise DataError(f"{path} is not an lmprof run record (schema={str(schema)[:80]!r})")
        try:
            run = cls.model_validate(data)
        except ValidationError as exc:  # the first problem in one line, naming the field
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err.get("loc", ())) or "record"
            msg = " ".join(str(err.get("msg", "invalid value")).split())[:200]
            raise DataError(f"{path} does not match {SCHEMA}: field {where}: {msg}") from None
        run._folder = path.parent
        return run


def _json_kind(data: Any) -> str:
    if data is None:
        return "null"
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(data), type(data).__name__)


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    write_text(path, buf.getvalue())
