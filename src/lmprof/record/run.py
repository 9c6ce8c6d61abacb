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
    misspelt key in a hand-made run.json, or a newer lmprof's field, is an error a reader sees."""

    model_config = ConfigDict(extra="forbid")


class Metric(Part):
    """One figure with its unit and source. ``value`` is the median when there are samples."""

    value: float | None
    unit: str
    source: Source
    p10: float | None = None
    p90: float | None = None
    n: int | None = None
    note: str | None = None
    # Timing figures only (step time, TTFT, TPOT, end-to-end latency and the rates drawn from them): what
    # they rest on. None on every other figure, and in run.json files written before the field, whose
    # first-call figures say so by a note beginning "first call" (analysis/marks.py reads both).
    basis: Basis | None = None

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
    phase: str
    time_ms: float
    profiled_ms: float
    pct: float
    calls: int | None = None
    flops: float | None = None
    bytes: float | None = None
    # p90 - p10 of the block's time over the profiled steps, on the time_ms scale: its uncertainty.
    spread_ms: float | None = None
    # Compiled runs: the part of time_ms that came from kernels fusing this block with others (its share
    # of each fused kernel, by FLOPs or bytes); None for eager runs.
    fused_ms: float | None = None
    # Operators called directly in the block per step (eager), plus the compiled kernels it owns
    # (compiled runs; a fused kernel counts for each of its blocks): what `lmprof compare` sets side by side.
    ops: float | None = None
    # A stopwatch around the block in a clean pass (device synchronised, no profiler), ms per step; None
    # where no stopwatch covers the block (analysis/block_truth.py).
    stopwatch_ms: float | None = None
    # Why the block's time_ms is not to be read as exact: it misses attribution's goal against that
    # stopwatch (+-10%, matmul blocks +-5%) by the error given. None: within the goal, or not checked.
    uncertain: str | None = None


class OpStat(Part):
    """One operator's aggregate over the profiled steps (per step averages)."""

    name: str
    calls: int
    self_ms: float
    total_ms: float
    self_pct: float
    phase: str = "step"
    device_ms: float | None = None


class Env(BaseModel):
    """Where the run happened."""

    model_config = ConfigDict(extra="allow")

    device: str
    device_name: str
    torch: str
    python: str
    lmprof: str
    os: str
    cpu: str
    threads: int
    hostname: str = ""
    cuda: str | None = None
    driver: str | None = None


# -- the whole-run watch (run.json's ``watch``; record/watch.py has its series files) -----------------

AlertKind = Literal["drift", "spike", "memory_creep", "input_bound", "straggler"]
RequestKind = Literal["alert", "signal", "file"]


class Baseline(Part):
    """What the clean window measured, that the watched steps are judged against.

    ``step_s_spread`` is the clean steps' own upper spread, slowest clean step minus their median (the
    spread analysis/noise.py judges a profiled step with).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    step_s_median: float = Field(gt=0)
    step_s_spread: float = Field(ge=0)
    n: int = Field(ge=1)
    memory_bytes: float | None = None  # memory at a clean step's end (allocated on CUDA, RSS on CPU)
    memory_capacity_bytes: float | None = None  # the device's memory, for "full in N steps"
    input_wait_s: float | None = None
    tokens_per_step: float | None = None

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
    first_step: int
    last_step: int
    message: str
    evidence: dict[str, Metric] = Field(default_factory=dict)
    # The condition still held at the last step the detectors saw.
    ongoing: bool = False


class Growth(Part):
    """A block or operator that took longer in a captured window than in the baseline window."""

    kind: Literal["block", "operator"]
    name: str
    phase: str
    before_ms: float  # per profiled step in the baseline window (0: absent there)
    after_ms: float  # per profiled step in the captured window
    delta_ms: float
    ratio: float | None  # after / before; None when new
    status: Literal["new", "grew"]
    noise_ms: float  # what a delta has to exceed to be more than noise
    beyond_noise: bool


class WatchCapture(Part):
    """A window profiled by itself while the run was watched."""

    path: str  # the child run folder, relative to the run folder
    first_step: int
    steps: int
    requested_by: RequestKind
    alert: int | None = None  # index into WatchSection.alerts of the alert that asked for it
    grew: list[Growth] = Field(default_factory=list)  # what grew against the baseline window, largest first
    note: str | None = None


class WatchSection(Part):
    """run.json's ``watch``: the series files, the baseline, the alerts and the captures."""

    series: list[str] = Field(default_factory=list)  # chunk files, relative to the run folder, in step order
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    baseline: Baseline | None = None
    device_time: str | None = None  # None: CUDA events gave device_s; else why device_s is n/a
    alerts: list[WatchAlert] = Field(default_factory=list)
    alerts_dropped: dict[str, int] = Field(default_factory=dict)  # kind -> alerts beyond the cap per kind
    captures: list[WatchCapture] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class Run(Part):
    """A complete run record. ``save`` writes the folder; ``load`` reads it back."""

    model_config = ConfigDict(populate_by_name=True)

    schema_: str = Field(default=SCHEMA, alias="schema")
    id: str
    mode: Mode
    created: str
    env: Env
    config: dict[str, Any]
    metrics: dict[str, Metric] = Field(default_factory=dict)
    blocks: list[Block] = Field(default_factory=list)
    ops: list[OpStat] = Field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    # A run whose timing is not to be trusted as it stands, and why (analysis/noise.py).
    noisy: bool = False
    noise: list[str] = Field(default_factory=list)
    # The whole-run watch (record/watch.py), absent from runs that were not watched.
    watch: WatchSection | None = None
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
