"""Two or more runs side by side: figures, per-block times, operator and kernel counts, with ratios.

The first run is the baseline **A**; every other run is compared with it and a ratio is always
*this run / A* (B/A): 0.5 for a step time means B takes half as long, 2.0 for tokens/s means B is
twice as fast. Whether a ratio above 1 is better depends on the figure (``higher_is_better``);
``speedups`` turns it into "times better than A" (A/B for times, B/A for throughputs): both
examples above are a speedup of 2.0.

:func:`compare_runs` is a pure function of the :class:`~lmprof.record.run.Run` objects (plus,
optionally, operator/kernel counts read from their traces by :func:`trace_counts`). It refuses runs
of different models, and training next to inference, unless told otherwise: such ratios compare
workloads, not configurations. It lists where the runs' environments differ (:func:`env_differences`)
and refuses the differences that change what executes the step (another device, torch, thread count
on a CPU) unless told otherwise: such ratios compare machines, not code. Figures resting on the timing
of a noisy run or on a first call carry those marks (:mod:`lmprof.analysis.marks`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from lmprof.analysis.marks import marks as figure_marks, run_marks
from lmprof.errors import LmprofError
from lmprof.modes import traits
from lmprof.names import PHASE_ORDER as _PHASE_ORDER
from lmprof.record.catalogue import PARAMS, Group as Group, group_of, lookup, ranked
from lmprof.record.run import SCHEMA, Run

# Figures shown first, in this order (those present in any run): the catalogue's compare ranks.
HEADLINE_KEYS = tuple(m.name for m in ranked("compare"))
# Model-identity fields read from run.config["model"] (built-in GPT) and compared when both runs have them.
MODEL_DIMS = ("n_layer", "n_head", "n_embd", "vocab_size")
Change = Literal["appeared", "disappeared", "changed", "same"]

# For a figure the catalogue does not know (a newer lmprof's record): units where a larger number is
# better; for times, bytes, joules and watts smaller is.
_HIGHER_UNITS = ("tokens/s", "FLOP/s", "FLOP/J", "B/s")

# Units one figure may be written in, as (dimension, factor to that dimension's base unit): a run
# whose step_time is in s is converted to A's ms, never read as ms. A unit outside this table must
# match A's exactly.
_UNIT_SCALE: dict[str, tuple[str, float]] = {
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "µs": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0),
    "B": ("bytes", 1.0), "KiB": ("bytes", 2.0**10), "MiB": ("bytes", 2.0**20), "GiB": ("bytes", 2.0**30),
    "kB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9),
    "mJ": ("energy", 1e-3), "J": ("energy", 1.0), "kJ": ("energy", 1e3),
    "mW": ("power", 1e-3), "W": ("power", 1.0), "kW": ("power", 1e3),
    "%": ("fraction", 1.0),
}


@dataclass(frozen=True)
class MetricRow:
    """One figure across the runs. ``ratios[i]`` is values[i] / values[0] (None when undefined)."""

    key: str
    group: Group
    unit: str
    values: tuple[float | None, ...]
    sources: tuple[str | None, ...]
    ratios: tuple[float | None, ...]
    higher_is_better: bool | None
    notes: tuple[str | None, ...] = ()
    # Per run, what makes the figure less than a clean median there ("noisy", "first call"; analysis/marks.py).
    marks: tuple[tuple[str, ...], ...] = ()

    def ratio_marks(self, i: int) -> tuple[str, ...]:
        """The marks a ratio of run ``i`` against A rests on: either run's, each once."""
        if not self.marks:
            return ()
        return tuple(dict.fromkeys((*self.marks[0], *self.marks[i])))

    @property
    def speedups(self) -> tuple[float | None, ...]:
        """How many times better each run is than A (A/B for times, B/A for throughputs); None if neutral."""
        if self.higher_is_better is None:
            return tuple(None for _ in self.ratios)
        return tuple(None if r is None or r == 0 else (r if self.higher_is_better else 1.0 / r) for r in self.ratios)


@dataclass(frozen=True)
class BlockRow:
    """One (block, phase) across runs, clean-step milliseconds; ``name == "(total)"`` for a phase total."""

    name: str
    phase: str
    times_ms: tuple[float | None, ...]
    pcts: tuple[float | None, ...]
    ratios: tuple[float | None, ...]
    # Operators (eager) or compiled kernels the block issued per step (Block.ops); None where unrecorded.
    ops: tuple[float | None, ...] = ()

    @property
    def speedups(self) -> tuple[float | None, ...]:
        """A's time / this run's time: 2.0 means the block takes half as long as in A."""
        return tuple(None if r is None or r == 0 else 1.0 / r for r in self.ratios)


@dataclass(frozen=True)
class CountRow:
    """Calls per step of one operator (or kernel) across runs; ``deltas[i]`` = counts[i] - counts[0]."""

    name: str
    counts: tuple[float, ...]
    deltas: tuple[float, ...]
    change: Change


@dataclass(frozen=True)
class TraceCounts:
    """Per-step call counts read from a run's trace: every CPU operator and every device kernel."""

    ops: dict[str, float]
    kernels: dict[str, float]
    steps: int


@dataclass(frozen=True)
class EnvDifference:
    """One fact of ``env`` (or of the configuration) that is not the same in every run.

    ``blocking``: the difference changes what executes the step, so ratios would compare machines or
    libraries rather than code; compare and the gate refuse it unless told otherwise.
    """

    key: str  # "env.threads", "config.dtype"
    values: tuple[str, ...]  # per run, as recorded ("—" where a run does not record it)
    blocking: bool
    why: str


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare_runs`."""

    labels: tuple[str, ...]
    run_ids: tuple[str, ...]
    modes: tuple[str, ...]
    descriptions: tuple[str, ...]
    metrics: tuple[MetricRow, ...]
    phases: tuple[BlockRow, ...]
    blocks: tuple[BlockRow, ...]
    ops: tuple[CountRow, ...]
    ops_source: str
    op_totals: tuple[float, ...]
    kernels: tuple[CountRow, ...]
    kernel_totals: tuple[float, ...] | None
    warnings: tuple[str, ...] = field(default=())
    # Where the runs' environments and configurations differ, blocking ones first.
    env: tuple[EnvDifference, ...] = field(default=())
    # Per run: "noisy: <reason>" / "first call: <note>" when its timed figures carry that mark.
    run_marks: tuple[tuple[str, ...], ...] = field(default=())

    def group(self, name: Group) -> list[MetricRow]:
        """The metric rows of one group, in display order."""
        return [m for m in self.metrics if m.group == name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict of everything (metric and block rows with their ``speedups``)."""
        d = asdict(self)
        for name in ("metrics", "phases", "blocks"):
            for row, obj in zip(d[name], getattr(self, name)):
                row["speedups"] = list(obj.speedups)
        return d


# -- checks --------------------------------------------------------------------------------------


def model_identity(run: Run) -> dict[str, Any]:
    """What identifies the model of a run: HF name, dimensions, parameter count (absent keys left out)."""
    c = run.config
    out: dict[str, Any] = {"hf": c.get("hf") or None}
    if c.get("model_name"):
        out["model_name"] = c["model_name"]
    found = c.get("model")
    model: dict[str, Any] = found if isinstance(found, dict) else {}
    for key in MODEL_DIMS:
        if model.get(key) is not None:
            out[key] = model[key]
    params = run.value(PARAMS)
    if params:
        out["params"] = int(params)
    return out


def model_differences(a: Run, b: Run) -> list[str]:
    """'n_layer: 4 vs 12' for every identity field both runs record with different values.

    ``hf`` is compared even when one side lacks it: a built-in GPT is not a Hugging Face model.
    """
    ia, ib = model_identity(a), model_identity(b)
    diffs = []
    for key in dict.fromkeys([*ia, *ib]):
        va, vb = ia.get(key), ib.get(key)
        if va == vb or (key != "hf" and (va is None or vb is None)):
            continue
        diffs.append(f"{key}: {va if va is not None else 'built-in GPT'} vs {vb if vb is not None else 'built-in GPT'}")
    return diffs


# Facts of ``env`` that decide what executes the step: a difference in one makes ratios compare
# machines or libraries instead of code. ``device`` is compared by kind (cuda:0 and cuda:1 are alike
# when their names agree).
BLOCKING_ENV: dict[str, str] = {
    "device": "another kind of device runs the step",
    "device_name": "another device model runs the step",
    "gpu_capability": "another GPU generation runs the step",
    "gpu_sm_count": "a GPU (or MIG slice) with another number of SMs runs the step",
    "gpu_memory_bytes": "a GPU (or MIG slice) of another size runs the step",
    "torch": "another torch version: other kernels and dispatch costs",
    "cuda": "another CUDA version: other kernels",
}
# ...and on a CPU run, where the host's cores are the device.
BLOCKING_ON_CPU: dict[str, str] = {
    "cpu": "another CPU model runs the step",
    "threads": "another number of threads runs each operator",
}
# Why the other facts are only listed: none changes what executes the step.
INFORMATIONAL_ENV: dict[str, str] = {
    "lmprof": "another lmprof version; the record's schema is the same, so its figures mean the same",
    "python": "another Python version; the step runs in torch's kernels",
    "os": "another OS release",
    "hostname": "another machine; its device, CPU model and threads are compared on their own",
    "driver": "another GPU driver",
    "cpu_count": "another number of cores on the machine; the threads the run used are compared on their own",
    "cpu_on_gpu": "another host CPU; the step runs on the GPU",
    "threads_on_gpu": "another number of host threads; the step runs on the GPU",
}
# Configuration a comparison is usually about (eager vs compiled, fp32 vs bf16): listed, never refused.
CONFIG_KEYS = ("dtype", "compile", "compile_mode", "attention", "batch_size", "seq_len", "new_tokens", "optimizer")
_UNRECORDED = "—"
# A recorded fact is shown at most this long: a record may come from anyone, and one line stays one line.
_SHOWN_CHARS = 80


def _shown(value: object) -> str:
    if value is None:
        return _UNRECORDED
    text = " ".join(str(value).split())
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _device_kind(device: object) -> str:
    return str(device).split(":", 1)[0]


def env_differences(runs: Sequence[Run]) -> list[EnvDifference]:
    """Where the runs' ``env`` and configuration differ: blocking differences first (:data:`BLOCKING_ENV`,
    :data:`BLOCKING_ON_CPU`), then the informational ones. A fact some run does not record is listed,
    never blocking: there is nothing to say it differs."""
    envs = [r.env.model_dump() for r in runs]
    on_cpu = any(_device_kind(e.get("device")) == "cpu" for e in envs)
    found: list[EnvDifference] = []
    for key in dict.fromkeys(k for e in envs for k in e):
        raw = [e.get(key) for e in envs]
        if len({repr(v) for v in raw}) == 1:
            continue
        recorded = all(v is not None for v in raw)
        if key == "device" and len({_device_kind(v) for v in raw}) == 1:
            blocking, why = False, "another device of the same kind"
        elif key in BLOCKING_ENV:
            blocking, why = recorded, BLOCKING_ENV[key]
        elif key in BLOCKING_ON_CPU:
            blocking = recorded and on_cpu
            why = BLOCKING_ON_CPU[key] if on_cpu else INFORMATIONAL_ENV[f"{key}_on_gpu"]
        else:
            blocking, why = False, INFORMATIONAL_ENV.get(key, "listed for the record")
        if not recorded:
            why = f"not recorded by every run ({why})"
        found.append(EnvDifference(f"env.{_shown(key)}", tuple(_shown(v) for v in raw), blocking, why))
    for key in CONFIG_KEYS:
        raw = [r.config.get(key) for r in runs]
        if len({repr(v) for v in raw}) > 1:
            found.append(EnvDifference(f"config.{key}", tuple(_shown(v) for v in raw), False,
                                       "configuration: what the comparison is about"))
    return sorted(found, key=lambda d: not d.blocking)


def describe_env_difference(d: EnvDifference) -> str:
    """'env.threads: 1 vs 2 (another number of threads runs each operator)'."""
    return f"{d.key}: {' vs '.join(d.values)} ({d.why})"


def check_comparable(runs: Sequence[Run], *, allow_different_models: bool = False,
                     allow_mixed_modes: bool = False, allow_env_diff: bool = False) -> list[str]:
    """Raise :class:`LmprofError` for runs that should not be compared; return warnings for forced ones.

    Refused: runs of different models (unless ``allow_different_models``), training next to inference
    (unless ``allow_mixed_modes``), and runs whose environments differ in what executes the step
    (unless ``allow_env_diff``; :func:`env_differences` lists every difference).
    """
    if len(runs) < 2:
        raise LmprofError(f"compare needs at least two runs, got {len(runs)}")
    for run in runs:
        if run.schema_ != SCHEMA:
            raise LmprofError(f"{run.id} is a {str(run.schema_)[:40]!r} record; this lmprof compares {SCHEMA} "
                              "records only (its fields and units may mean something else)")
    warnings: list[str] = []
    base = runs[0]
    for other in runs[1:]:
        if other.mode != base.mode:
            msg = (f"{base.id} is {traits(base.mode).article} {base.mode} run but {other.id} is "
                   f"{traits(other.mode).article} {other.mode} run")
            if not allow_mixed_modes:
                raise LmprofError(f"{msg}: their figures measure different things (use --force to compare anyway)")
            warnings.append(msg)
        diffs = model_differences(base, other)
        if diffs:
            msg = f"{base.id} and {other.id} profile different models ({'; '.join(diffs)})"
            if not allow_different_models:
                raise LmprofError(f"{msg}: use --force to compare anyway")
            warnings.append(msg)
    blocking = [d for d in env_differences(runs) if d.blocking]
    if blocking and not allow_env_diff:
        listed = "; ".join(describe_env_difference(d) for d in blocking)
        raise LmprofError(f"the runs ran in different environments: {listed}. Their ratios would compare the "
                          "environments, not the code (use --allow-env-diff to compare anyway)")
    return warnings


# -- rows ------------------------------------------------------------------------------------------


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return value / base


def _ratios(values: Sequence[float | None]) -> tuple[float | None, ...]:
    return tuple(ratio(v, values[0]) for v in values)


def higher_is_better(key: str, unit: str) -> bool | None:
    """True for throughputs and utilisations, False for times, bytes and energy, None when neutral.

    The catalogue says it for every figure lmprof writes (sizes of the workload, device peaks, a loss
    on other seeds or an overhead that can be negative have no better direction); an unknown figure
    goes by its unit.
    """
    spec = lookup(key)
    if spec is not None:
        return spec.higher_is_better
    if unit in _HIGHER_UNITS:
        return True
    if unit in ("ms", "s", "B", "J", "W") or unit.startswith("J/"):
        return False
    return None


def unit_factor(key: str, unit: str, to: str) -> float:
    """What multiplies a value of ``key`` in ``unit`` to give it in ``to``; LmprofError when no factor exists."""
    if unit == to:
        return 1.0
    a, b = _UNIT_SCALE.get(unit), _UNIT_SCALE.get(to)
    if a is None or b is None or a[0] != b[0]:
        raise LmprofError(f"cannot compare {key}: one run gives it in {unit[:20]!r}, another in {to[:20]!r}")
    return a[1] / b[1]


def _in_unit(m: Any, key: str, unit: str) -> float | None:
    if m is None or m.value is None:
        return None
    return float(m.value) * unit_factor(key, m.unit, unit)


def metric_rows(runs: Sequence[Run]) -> list[MetricRow]:
    """One row per figure any run has: headline keys first, then the rest in first-seen order.

    Each figure is given in the unit of the first run that has it; other runs' values are converted
    (s to ms, MiB to B, ...) or, where no conversion exists, refused with :class:`LmprofError`.
    """
    seen: dict[str, None] = {}
    for r in runs:
        for k in r.metrics:
            seen.setdefault(k)
    keys = [k for k in HEADLINE_KEYS if k in seen] + [k for k in seen if k not in HEADLINE_KEYS]
    rows = []
    for key in keys:
        ms = [r.metrics.get(key) for r in runs]
        unit = next(m.unit for m in ms if m is not None)
        values = tuple(_in_unit(m, key, unit) for m in ms)
        rows.append(MetricRow(
            key=key, group=group_of(key), unit=unit, values=values,
            sources=tuple(None if m is None else m.source for m in ms), ratios=_ratios(values),
            higher_is_better=higher_is_better(key, unit),
            notes=tuple(None if m is None else (m.note if m.value is None else None) for m in ms),
            marks=tuple(figure_marks(r, key, unit) if m is not None and m.value is not None else ()
                        for r, m in zip(runs, ms)),
        ))
    return rows


def block_rows(runs: Sequence[Run]) -> tuple[list[BlockRow], list[BlockRow]]:
    """(phase totals, per-block rows) in clean-step ms; blocks absent from a run are None there."""
    per_run: list[dict[tuple[str, str], tuple[float, float]]] = []
    ops_run: list[dict[tuple[str, str], float | None]] = []
    order: dict[tuple[str, str], None] = {}
    for r in runs:
        d: dict[tuple[str, str], tuple[float, float]] = {}
        o: dict[tuple[str, str], float | None] = {}
        for b in r.blocks:
            t, p = d.get((b.name, b.phase), (0.0, 0.0))
            d[(b.name, b.phase)] = (t + b.time_ms, p + b.pct)
            prev = o.get((b.name, b.phase), 0.0)
            o[(b.name, b.phase)] = None if b.ops is None or prev is None else prev + b.ops
            order.setdefault((b.name, b.phase))
        per_run.append(d)
        ops_run.append(o)
    # Phases in step order; within a phase the largest block (in any run) first.
    def rank(key: tuple[str, str]) -> tuple[int, float]:
        biggest = max((d[key][0] for d in per_run if key in d), default=0.0)
        return (_PHASE_ORDER.index(key[1]) if key[1] in _PHASE_ORDER else len(_PHASE_ORDER), -biggest)

    order = dict.fromkeys(sorted(order, key=rank))
    blocks = []
    for key in order:
        times = tuple(d[key][0] if key in d else None for d in per_run)
        pcts = tuple(d[key][1] if key in d else None for d in per_run)
        ops = tuple(o.get(key) for o in ops_run)
        blocks.append(BlockRow(key[0], key[1], times, pcts, _ratios(times), ops))
    phases = []
    for phase in dict.fromkeys(p for _, p in order):
        times = tuple(
            sum(t for (n, p), (t, _) in d.items() if p == phase) if any(p == phase for _, p in d) else None
            for d in per_run)
        pcts = tuple(
            sum(s for (n, p), (_, s) in d.items() if p == phase) if any(p == phase for _, p in d) else None
            for d in per_run)
        ops = tuple(_sum_or_none([v for (n, p), v in o.items() if p == phase]) for o in ops_run)
        phases.append(BlockRow("(total)", phase, times, pcts, _ratios(times), ops))
    return phases, blocks


def _sum_or_none(values: Sequence[float | None]) -> float | None:
    """The sum, or None when there is nothing to add or any value is unrecorded."""
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None))


def count_rows(counts: Sequence[Mapping[str, float]]) -> list[CountRow]:
    """Per-name counts across runs with deltas against the first.

    Order: appeared, disappeared, changed, same; within each, largest |delta| first.
    """
    names: dict[str, None] = {}
    for c in counts:
        for n in c:
            names.setdefault(n)
    rows = []
    for n in names:
        cs = tuple(float(c.get(n, 0.0)) for c in counts)
        deltas = tuple(x - cs[0] for x in cs)
        if cs[0] == 0 and any(x > 0 for x in cs[1:]):
            change: Change = "appeared"
        elif cs[0] > 0 and all(x == 0 for x in cs[1:]):
            change = "disappeared"
        elif any(abs(d) > 1e-9 for d in deltas):
            change = "changed"
        else:
            change = "same"
        rows.append(CountRow(n, cs, deltas, change))
    # New names first (what a change introduced, e.g. compiled kernels), then the ones that went away.
    rank = {"appeared": 0, "disappeared": 1, "changed": 2, "same": 3}
    rows.sort(key=lambda r: (rank[r.change], -max(abs(d) for d in r.deltas), -max(r.counts), r.name))
    return rows


def _op_counts(run: Run) -> dict[str, float]:
    return {o.name: float(o.calls) for o in run.ops}


def _describe(run: Run) -> str:
    c = run.config
    model = c.get("hf") or c.get("model_name") or f"GPT {c.get('preset', '?')}"
    parts = [run.mode, str(model), run.env.device]
    for key in ("batch_size", "seq_len"):
        if c.get(key):
            parts.append(f"{key.split('_')[0]} {c[key]}")
    for key in ("dtype", "attention"):
        if c.get(key):
            parts.append(str(c[key]))
    parts.append("compiled" if c.get("compile") else "eager")
    return ", ".join(parts)


def compare_runs(
    runs: Sequence[Run],
    *,
    allow_different_models: bool = False,
    allow_mixed_modes: bool = False,
    allow_env_diff: bool = False,
    trace_counts: Sequence[TraceCounts | None] | None = None,
) -> Comparison:
    """Compare ``runs`` (the first is the baseline A); ratios are each run / A.

    Raises :class:`LmprofError` for fewer than two runs, runs of different models (unless
    ``allow_different_models``), train next to infer (unless ``allow_mixed_modes``) or runs whose
    environments differ in what executes the step (unless ``allow_env_diff``).
    ``trace_counts`` (one per run, from :func:`trace_counts`) gives complete operator counts and
    kernel counts; without it operator counts come from each run's recorded top operators.
    """
    warnings = check_comparable(runs, allow_different_models=allow_different_models,
                                allow_mixed_modes=allow_mixed_modes, allow_env_diff=allow_env_diff)
    labels = tuple(chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(len(runs)))
    tc = list(trace_counts) if trace_counts is not None else [None] * len(runs)
    if len(tc) != len(runs):
        raise ValueError("trace_counts must have one entry per run")
    complete = [t for t in tc if t is not None]
    if len(complete) == len(tc):
        op_counts = [t.ops for t in complete]
        ops_source = "trace (every CPU operator, calls per profiled step)"
    else:
        op_counts = [_op_counts(r) for r in runs]
        ops_source = "recorded top operators (ops.csv, calls per profiled step)"
        if trace_counts is not None:
            warnings.append("some runs have no readable trace: operator counts use the recorded top operators only")
    kernel_counts = [t.kernels for t in complete] if len(complete) == len(tc) else None
    if kernel_counts is not None and not any(kernel_counts):
        kernel_counts = None  # CPU traces: no device kernels to compare
    phases, blocks = block_rows(runs)
    return Comparison(
        labels=labels,
        run_ids=tuple(r.id for r in runs),
        modes=tuple(r.mode for r in runs),
        descriptions=tuple(_describe(r) for r in runs),
        metrics=tuple(metric_rows(runs)),
        phases=tuple(phases),
        blocks=tuple(blocks),
        ops=tuple(count_rows(op_counts)),
        ops_source=ops_source,
        op_totals=tuple(sum(c.values()) for c in op_counts),
        kernels=tuple(count_rows(kernel_counts)) if kernel_counts else (),
        kernel_totals=tuple(sum(c.values()) for c in kernel_counts) if kernel_counts else None,
        warnings=tuple(warnings),
        env=tuple(env_differences(runs)),
        run_marks=tuple(tuple(run_marks(r)) for r in runs),
    )


# -- reading counts from a trace (I/O; kept apart from the pure functions above) ---------------


def _profiled_steps(run: Run, annotation_names: Sequence[str]) -> int:
    rows = run.tables.get("attribution") or []
    if rows and rows[0].get("profiled_steps"):
        return int(rows[0]["profiled_steps"])
    steps = sum(1 for n in annotation_names if n.startswith("ProfilerStep#"))
    return max(steps, 1)


def trace_counts(run: Run) -> TraceCounts | None:
    """Per-step counts of every CPU operator and device kernel in the run's trace; None without one."""
    if run.folder is None or "trace" not in run.files:
        return None
    path = Path(run.folder) / run.files["trace"]
    if not path.is_file():
        return None
    from lmprof.trace.load import load_trace  # lazy: pandas/msgspec only when a trace is read

    try:
        table = load_trace(path)
    except LmprofError:
        return None
    ev = table.events
    cats = ev["cat"].astype(str)
    names = ev["name"].astype(str)
    steps = _profiled_steps(run, names[cats == "user_annotation"].tolist())
    # lmprof's own ranges are annotations, not operators; cpu_op is Kineto's name ("operator" before 2021).
    ops = Counter(n for n in names[cats.isin(["cpu_op", "operator"])] if not n.startswith("lmprof:"))
    kernels = Counter(names[cats == "kernel"])
    return TraceCounts(
        ops={k: v / steps for k, v in ops.items()},
        kernels={k: v / steps for k, v in kernels.items()},
        steps=steps,
    )
