"""Is a run's timing trustworthy? Reasons a run is noisy, from its samples and the machine's load.

Each rule gives a sentence with the figure behind it; a run with any is marked ``noisy`` in
run.json, and the summary, the report and sweep plots say so. Thresholds are stated here once.

The profiled window is judged against the clean steps' *own* spread, never a fixed percentage: a
profiled step is expected to take the clean median plus the profiler's measured cost (events x
cost per event, measure/profiler_cost.py); it is flagged only when it lies beyond that by twice the
clean steps' own spread up to their slowest step (and by at least half a step, so a very steady
run is not flagged for a few percent), and the step is named with how much slower it was. The same
holds the other way: a profiled window faster than the clean steps is flagged only when it is
below their fastest step by their own spread. With one or two profiled steps, a block repeated in
every layer whose one instance far exceeds the others is flagged too (a disturbance inside the
window that per-step medians cannot reject). Clean steps on a steady trend (analysis/step_trend.py)
are said as one, and the profiled steps are judged where the trend leads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from lmprof.analysis.step_trend import steady_trend
from lmprof.measure.noise import OTHER_CORES_LIMIT, Snapshot, other_load
from lmprof.record.run import Run
from lmprof.trace.attribution import Attribution

# p90 / p10 of the timed steps above this: the steps do not agree with each other.
SPREAD_LIMIT = 1.25
# Fewer timed steps than this have no spread to judge by.
MIN_SPREAD_SAMPLES = 3
# Cores other processes kept busy during the timed window, as a share of the cores not in use by
# this run's threads, above which they competed for the CPU (CPU runs) or the host (GPU runs): the
# one limit of hardware/cpu_load.py (OTHER_CORES_LIMIT), judged there at the counters' resolution.
# A profiled step is "much slower" when it exceeds the clean median + the profiler's measured cost
# by more than SLOW_SPREADS x the clean steps' own upper spread (slowest clean step - median), and by
# at least SLOW_MIN_SHARE of the clean median; COST_SLACK of the measured cost is allowed on top
# (the cost per event is itself measured, with its own error). The slowest clean step, not p90: on
# a shared machine step times have a long tail, and a profiled step drawn from that same tail is
# within the run's own spread.
SLOW_SPREADS = 2.0
SLOW_MIN_SHARE = 0.5
COST_SLACK = 0.5
# ...and never less than this, in ms: on a sub-millisecond step, the hooks and ranges lmprof adds per
# block cost a fixed fraction of a millisecond the per-event cost does not cover (quiet runs of a
# 0.45 ms step profiled at 1.1 ms, 1 of 4 flagged at a 0.5 ms floor; at this one the limit is
# 1.2 ms plus the cost), while a disturbance worth naming (another process taking the core for a
# scheduler slice) costs milliseconds. Below a step: at 1 ms (the floor it replaced), a profiled
# step twice the quiet one's (1 ms + cost) sat on the limit and was not flagged.
SLOW_MIN_MS = 0.75
# Where the profiler's cost was not measured (device clock), its host cost is unknown: only a
# profiled step more than this share above the clean median (and beyond the spread) is flagged.
SLOW_MIN_SHARE_UNMEASURED = 1.0
# The profiled window is "clearly faster" when its median is below the fastest clean step by more
# than FAST_SPREADS x the clean steps' lower spread (median - fastest), and below the clean median
# by at least FAST_MIN_SHARE (the profiler only adds time, so this is noise in the clean window).
FAST_SPREADS = 1.0
FAST_MIN_SHARE = 0.05
# One profiled step (or two): a block's largest instance in the step (one layer's ln_1 backward)
# above REPEAT_FACTOR x its median instance, with the excess above REPEAT_MIN_STEP_SHARE of the
# step, is a disturbance the block medians cannot reject.
REPEAT_FACTOR = 4.0
REPEAT_MIN_STEP_SHARE = 0.03
# With this many profiled steps or more, the per-block medians and the operator table's per-operator
# medians reject one disturbed step, so single-instance outliers are not flagged.
MEDIAN_STEPS = 3


@dataclass(frozen=True)
class ProfiledWindow:
    """What the run recorded of its profiled window (run.tables["attribution"]), in ms."""

    steps_ms: list[float]
    cost_ms: float | None  # the profiler's measured cost per step (None: not measured)
    outliers: list[dict[str, Any]] = field(default_factory=list)  # from :func:`block_outliers`


def profiled_window(run: Run) -> ProfiledWindow | None:
    """The profiled window of a run record, None when it has none."""
    rows = run.tables.get("attribution") or []
    if not rows or not rows[0].get("profiled_step_ms"):
        return None
    row = rows[0]
    cost = row.get("removed_ms_per_step") if row.get("event_cost_us") else None
    if cost is not None:  # lmprof's own hooks in a profiled step are instrumentation too (not in a clean step)
        cost = float(cost) + float(row.get("lmprof_ms_per_step") or 0.0)
    return ProfiledWindow([float(x) for x in row["profiled_step_ms"]], None if cost is None else float(cost),
                          list(row.get("outliers") or []))


def warming_steps(samples_ms: list[float]) -> int:
    """How many leading timed samples were still warming up: the fewest k (a minority) whose removal leaves
    samples that agree with each other (p90/p10 within :data:`SPREAD_LIMIT`), each of the k slower than the
    rest's median. 0 when the samples agree as they are, or when no such minority explains their spread."""
    n = len(samples_ms)
    if n < MIN_SPREAD_SAMPLES or _ratio(samples_ms) <= SPREAD_LIMIT:
        return 0
    for k in range(1, (n - 1) // 2 + 1):  # the rest keeps a majority, so the median is one of its samples
        rest = samples_ms[k:]
        if len(rest) < MIN_SPREAD_SAMPLES:
            break
        if _ratio(rest) <= SPREAD_LIMIT and min(samples_ms[:k]) > float(np.median(rest)):
            return k
    return 0


def _ratio(samples_ms: list[float]) -> float:
    p10, p90 = np.percentile(samples_ms, [10, 90])
    return float(p90 / p10) if p10 > 0 else float("inf")


def spread_reason(samples_ms: list[float], what: str) -> str | None:
    """A sentence when the timed samples spread more than :data:`SPREAD_LIMIT`; leading samples that were
    still warming up (:func:`warming_steps`) are not noise: :func:`warming_note` says so instead. Samples
    spread by a steady trend (analysis/step_trend.py) get a sentence that says so, not one of noise."""
    samples_ms = samples_ms[warming_steps(samples_ms):]
    if len(samples_ms) < MIN_SPREAD_SAMPLES:
        return None
    p10, p90 = np.percentile(samples_ms, [10, 90])
    if not (p10 > 0 and p90 / p10 > SPREAD_LIMIT):
        return None
    trend = steady_trend(samples_ms, SPREAD_LIMIT)
    if trend is not None:
        return (f"{trend.describe(what)}: the {what}'s own work grows or shrinks (an optimizer's history, a "
                f"sequence-length schedule, tensors kept alive) or the device changed speed (clocks, heat); not "
                f"random noise, but the median ({np.median(samples_ms):.3g} ms) is of these {what}s, not of a "
                "steady state")
    return (f"{what} times vary {p90 / p10:.2f}x between p10 ({p10:.3g} ms) and p90 ({p90:.3g} ms); "
            f"steady runs stay under {SPREAD_LIMIT:.2f}x")


# A sample spread is the input's when the samples less their waits spread by at most this share of it.
INPUT_SHARE = 0.25


def input_paced(samples_ms: list[float], waits_ms: Sequence[float | None] | None) -> tuple[list[float], list[float]] | None:
    """The samples past warm-up and their waits, when the samples spread more than :data:`SPREAD_LIMIT` by their
    wait for input: the rest of each sample (its time less its wait) stays within the limit, or spreads by at
    most :data:`INPUT_SHARE` of the samples' own spread (p90 - p10; a 0.5 ms step waiting 1-13 ms for its
    batch jitters by more than 1.25x, and that jitter is not what spreads it)."""
    if waits_ms is None or len(waits_ms) != len(samples_ms) or any(w is None for w in waits_ms):
        return None
    k = warming_steps(samples_ms)
    samples, waits = samples_ms[k:], [float(w) for w in waits_ms[k:] if w is not None]
    if len(samples) < MIN_SPREAD_SAMPLES or _ratio(samples) <= SPREAD_LIMIT:
        return None
    rest = [s - w for s, w in zip(samples, waits)]
    if min(rest) <= 0:
        return None
    spread, rest_spread = (float(np.subtract(*np.percentile(x, [90, 10]))) for x in (samples, rest))
    if _ratio(rest) > SPREAD_LIMIT and rest_spread > INPUT_SHARE * spread:
        return None
    return samples, waits


def input_note(samples_ms: list[float], waits_ms: Sequence[float | None] | None, what: str) -> str | None:
    """The run's note when its samples spread only by their wait for input (:func:`input_paced`): a loop
    whose batches arrive unevenly (DataLoader workers delivering in bursts), not noise."""
    paced = input_paced(samples_ms, waits_ms)
    if paced is None:
        return None
    samples, waits = paced
    rest = [s - w for s, w in zip(samples, waits)]
    (p10, p90), (w10, w90), (r10, r90) = (np.percentile(x, [10, 90]) for x in (samples, waits, rest))
    mean = float(np.mean(samples))
    return (f"{what} times vary {p90 / p10:.2f}x (p10 {p10:.3g} ms, p90 {p90:.3g} ms) only by their wait for input: "
            f"the time from each {what}'s start to the model's first forward (host clock) spans {w10:.3g}-{w90:.3g} "
            f"ms, and the rest of the {what} only {r10:.3g}-{r90:.3g} ms: the loop waits on batches that "
            f"arrive unevenly (DataLoader workers delivering in bursts, or too few of them), which is its own "
            f"behaviour, not noise. The {what} time is therefore their mean, {mean:.3g} ms ({1e3 / mean:.3g} {what}s/s), "
            f"which throughput follows, and the rates and MFU are of it; their median ({np.median(samples):.3g} ms) "
            f"falls between the waiting {what}s and the others")


def warming_note(samples_ms: list[float], what: str) -> str | None:
    """The run's note when its first timed samples were still warming up (caches, the allocator, lazy
    set-up): their figures, the steady rest's median beside the median of all, and the cure."""
    k = warming_steps(samples_ms)
    if not k:
        return None
    n, rest = len(samples_ms), samples_ms[k:]
    first = ", ".join(f"{x:#.3g}" for x in samples_ms[:k])
    return (f"the first {k} of {n} clean {what}s ({first} ms) ran slower than the rest (median {np.median(rest):#.3g} "
            f"ms, p90/p10 {_ratio(rest):.2f}x): the model was still warming up when timing began, not noise; "
            f"the {what} median of all {n} is {np.median(samples_ms):#.3g} ms; {k} more warm-up {what}"
            f"{'s' if k > 1 else ''} would leave them out")


def load_reason(before: Snapshot, after: Snapshot, device_kind: str) -> str | None:
    """A sentence when other processes kept the machine busy during the timed window, beyond what the
    counters' resolution could misread (hardware/cpu_load.py); None for a window too short to judge
    (:func:`load_note` says so)."""
    others = other_load(before, after, device_kind)
    if others is None:
        load = max(x for x in (before.loadavg_1m, after.loadavg_1m, 0.0) if x is not None)
        free = max(before.cpus - before.threads, 1) if device_kind == "cpu" else before.cpus
        if load > before.threads + OTHER_CORES_LIMIT * free:
            return f"1-minute load average {load:.1f} on {before.cpus} cores while this run used {before.threads} thread(s)"
        return None
    if others.busy:
        return (f"other processes kept {others.reading()} busy during the timed window "
                f"(this run used {before.threads} thread(s); limit {others.limit:.2g} cores)")
    return None


def load_note(before: Snapshot, after: Snapshot, device_kind: str) -> str | None:
    """The run's note when its timed window is too short for the CPU-time counters to judge the
    machine's load: said, not guessed (None when it could be judged or no counters exist)."""
    others = other_load(before, after, device_kind)
    if others is None or others.judgeable:
        return None
    return f"machine load during the timed window: {others.too_short()}"


def slow_limit_ms(samples_ms: list[float], cost_ms: float | None) -> float:
    """The longest a profiled step may take before it is 'much slower' than the clean steps."""
    med, top = float(np.median(samples_ms)), max(samples_ms)
    return step_slow_limit_ms(med, top - med, cost_ms)


def step_slow_limit_ms(median_ms: float, spread_ms: float, cost_ms: float | None) -> float:
    """:func:`slow_limit_ms` from the clean steps' median and own upper spread (slowest - median), for a
    caller that keeps those two figures rather than the samples (the whole-run watch: ``cost_ms`` 0)."""
    spread = SLOW_SPREADS * spread_ms
    if cost_ms is None:
        return median_ms + max(spread, SLOW_MIN_SHARE_UNMEASURED * median_ms, SLOW_MIN_MS)
    return median_ms + (1 + COST_SLACK) * cost_ms + max(spread, SLOW_MIN_SHARE * median_ms, SLOW_MIN_MS)


def fast_limit_ms(samples_ms: list[float]) -> float:
    """The shortest the profiled window's median may be before it is 'clearly faster' than the clean steps."""
    med, low = float(np.median(samples_ms)), min(samples_ms)
    return min(low - FAST_SPREADS * (med - low), med * (1 - FAST_MIN_SHARE))


def window_slow_limit_ms(median_ms: float, spread_ms: float) -> float:
    """The longest the median of a window of steps may be before the window is 'clearly slower' than the
    clean steps: :func:`fast_limit_ms` mirrored (above the slowest clean step by FAST_SPREADS x their upper
    spread, and above their median by at least FAST_MIN_SHARE)."""
    return max(median_ms + (1 + FAST_SPREADS) * spread_ms, median_ms * (1 + FAST_MIN_SHARE))


def window_reasons(samples_ms: list[float], what: str, window: ProfiledWindow | None) -> list[str]:
    """Sentences naming the profiled step(s) much slower, or the window clearly faster, than the clean
    steps explain (the profiler's measured cost and the clean steps' own spread allowed for). Clean steps
    on a steady trend (analysis/step_trend.py) are extrapolated to the profiled ones, which come after them
    (and after the profiler's own warm-up step): the growth they showed is not a disturbance."""
    if window is None or not samples_ms or not window.steps_ms:
        return []
    med = float(np.median(samples_ms))
    if med <= 0:
        return []
    steps, n = window.steps_ms, len(window.steps_ms)
    cost = window.cost_ms
    trend = steady_trend(samples_ms, SPREAD_LIMIT) if _ratio(samples_ms) > SPREAD_LIMIT else None
    if trend is not None and trend.at(len(samples_ms) + n) <= 0:
        trend = None  # a falling line that leads below zero by the profiled steps: no time to judge them by
    if trend is None:
        base = [med] * n
        his = [slow_limit_ms(samples_ms, cost)] * n
        lo = fast_limit_ms(samples_ms)
        clean = f"the clean {what} ({med:.3g} ms)"
    else:
        base = [trend.at(len(samples_ms) + 1 + j) for j in range(n)]
        ratios = np.asarray(samples_ms) / np.asarray([trend.at(i) for i in range(len(samples_ms))])
        his = [step_slow_limit_ms(b, b * (float(ratios.max()) - 1), cost) for b in base]
        b = float(np.median(base))
        lo = min(b * float(ratios.min()) - FAST_SPREADS * b * (1 - float(ratios.min())), b * (1 - FAST_MIN_SHARE))
        clean = f"where the clean {what}s' trend leads ({', '.join(f'{x:.3g}' for x in base)} ms)"
    expected = float(np.median(base)) + (cost or 0.0)
    explained = (f"{clean} + the profiler's measured cost ({cost:.3g} ms)" if cost is not None
                 else f"{clean}; the profiler's cost is not measured on this clock")
    slow = [i for i, s in enumerate(steps) if s > his[i]]
    out = []
    tables = ("the operator table and block times use the median profiled step" if n >= MEDIAN_STEPS
              else "the operator table and block times come from these steps alone: rerun")
    limit = f"limit {his[0]:.3g} ms" if trend is None else f"limits {', '.join(f'{h:.3g}' for h in his)} ms"
    if slow and len(slow) == n:
        window_ms = float(np.median(steps))
        out.append(f"the profiled window ({n} {what}{'s' if n > 1 else ''}, median {window_ms:.3g} ms) ran "
                   f"{window_ms / expected:.2f}x {explained}, beyond the clean {what}s' own spread "
                   f"({limit}): something else ran while profiling; {tables}")
    elif slow:
        listed = ", ".join(f"{i + 1} ({steps[i]:.3g} ms, {steps[i] / (base[i] + (cost or 0.0)):.2f}x)" for i in slow)
        out.append(f"profiled {what} {listed} of {n} took longer than {explained} by more than the clean "
                   f"{what}s' own spread allows ({limit}): something else ran during it; {tables}")
    window_ms = float(np.median(steps))
    if window_ms < lo:
        ref = float(np.median(base))
        out.append(f"the profiled window (median {window_ms:.3g} ms) ran {100 * (1 - window_ms / ref):.1f}% faster "
                   f"than {clean}, below the clean {what}s' own spread (limit {lo:.3g} ms): "
                   "the clean window was disturbed or the machine changed speed")
    out.extend(repeat_reasons(window, samples_ms))
    return out


def block_outliers(att: Attribution) -> list[dict[str, Any]]:
    """Repeated owners (a block in every layer) with one instance far above the others, in runs with
    fewer than :data:`MEDIAN_STEPS` profiled steps (where block medians cannot reject a disturbed
    step): the figures for run.tables["attribution"]["outliers"]."""
    if att.steps >= MEDIAN_STEPS or att.clock != "cpu":
        return []
    out = []
    for r in att.repeats:
        step_us = att.step_us[r.step] if r.step < len(att.step_us) else 0.0
        excess = r.max_us - r.median_us
        if step_us > 0 and r.max_us > REPEAT_FACTOR * r.median_us and excess > REPEAT_MIN_STEP_SHARE * step_us:
            out.append({"block": r.name, "phase": r.phase, "owner": r.owner, "step": r.step + 1, "calls": r.n,
                        "median_ms": r.median_us / 1e3, "max_ms": r.max_us / 1e3,
                        "step_share_pct": 100.0 * r.max_us / step_us})
    return sorted(out, key=lambda o: -float(o["max_ms"]) + float(o["median_ms"]))


def repeat_reasons(window: ProfiledWindow, samples_ms: list[float]) -> list[str]:
    """One sentence per block with a single disturbed instance (see :func:`block_outliers`)."""
    return [f"{o['block']} ({o['phase']}): one of its {o['calls']} {o['owner']} calls in profiled step {o['step']} "
            f"took {o['max_ms']:.3g} ms against a median {o['median_ms']:.3g} ms per call "
            f"({o['step_share_pct']:.1f}% of the step): a disturbance inside the profiled window, so this block's "
            "time is uncertain" for o in window.outliers]


def noise_reasons(samples_ms: list[float], what: str, before: Snapshot, after: Snapshot, device_kind: str,
                  window: ProfiledWindow | None = None, waits_ms: Sequence[float | None] | None = None) -> list[str]:
    """Every reason the run's timing is not to be trusted as it stands (empty: a steady run). The profiled
    window is judged against the clean steps past any still warming up (their spread is not the run's).
    Samples that spread only by their wait for input (``waits_ms``, one a sample) are no reason:
    :func:`input_note` says so."""
    spread = None if input_paced(samples_ms, waits_ms) is not None else spread_reason(samples_ms, what)
    found = [spread, load_reason(before, after, device_kind)]
    return [r for r in found if r] + window_reasons(samples_ms[warming_steps(samples_ms):], what, window)
