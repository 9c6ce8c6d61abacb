"""The whole-run watch's detectors: drift, spikes, memory creep, input-bound stretches, stragglers.

Each judges the watched steps against the clean window's :class:`~lmprof.record.run.Baseline` with the
noise rules of :mod:`lmprof.analysis.noise`, never a threshold of its own for "slower":

- **drift**: the median of the last ``window`` steps is above :func:`~lmprof.analysis.noise.window_slow_limit_ms`
  (the clean steps' "clearly faster" rule mirrored: beyond the slowest clean step by their own spread
  and at least 5% above their median). The alert's ``first_step`` is where the slow stretch began.
- **spike**: a stretch of at most ``window // 2`` steps each above
  :func:`~lmprof.analysis.noise.step_slow_limit_ms` (the rule a profiled step is called "much slower"
  by, with no profiler cost: 1.5x the median at least) around the current rolling median; a longer
  stretch is drift, not a spike.
- **memory_creep**: a Theil-Sen slope (the median of every pairwise slope, which one jump cannot
  move) over the memory samples of the last ``creep_window`` steps (at least ``creep_min_samples`` of
  them: the watch reads memory every few steps when a read is dear), and over a thinned history of the whole watch,
  whose growth across the fit exceeds twice the residuals' own spread (p90 - p10, SLOW_SPREADS) and
  ``creep_min_share`` of the memory in use.
- **input_bound**: over the last ``window`` steps the input wait (the device's idle time before the
  forward on CUDA, else the host's) adds up to at least ``input_share`` of the step time.
- **straggler** (:func:`stragglers`): one rank's rolling median of a per-step figure beyond the other
  ranks' by the drift rule, and by at least 5% of the step.

The watch's own time inside a step (``own_s``: spilling a chunk) is taken out before judging, so lmprof
never alerts on itself. Every alert carries its figures with units (:class:`~lmprof.record.run.Metric`).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from lmprof.analysis.noise import (
    FAST_MIN_SHARE, MIN_SPREAD_SAMPLES, SLOW_SPREADS, step_slow_limit_ms, window_slow_limit_ms,
)
from lmprof.record.run import Baseline, Metric, Source, WatchAlert, percentile
from lmprof.units import si

Columns = Mapping[str, np.ndarray]
# A Theil-Sen fit uses at most this many points (2,016 pairs), picked evenly from its stretch.
FIT_POINTS = 64
# The memory samples whose spacing sets how many samples span a creep fit's steps.
FIRST_SAMPLES = 9

# What each alert means for the user, in one line (the panel, the report and docs/user-code.md say it).
WHAT_TO_DO: dict[str, str] = {
    "drift": "the step got slower and stayed slower: compare the captured window's blocks and operators with the "
             "baseline (the diff names what grew); look for a slow node, throttling, a slower data shard, fragmentation",
    "spike": "a few steps were much slower than their neighbours: checkpointing, evaluation, garbage collection or "
             "another process; harmless when rare, worth moving off the training loop when periodic",
    "memory_creep": "memory grows every step: something keeps tensors alive (a list of losses with their graphs, a "
                    "cache, growing sequence lengths); the rate says when it runs out",
    "input_bound": "the device waits for input: more DataLoader workers, pin_memory, prefetching, or data on a "
                   "faster disk",
    "straggler": "one rank is slower than the others and every synchronising step waits for it: check that rank's "
                 "node (its data, its device's clocks and temperature, other jobs on it)",
}


@dataclass(frozen=True)
class Rules:
    """The detectors' windows and thresholds (the noise limits themselves come from analysis/noise.py)."""

    window: int = 16  # steps in a rolling median (drift, spikes' neighbourhood, stragglers) and an input stretch
    creep_window: int = 128  # steps the recent fit spans (its samples: those the memory was read in)
    creep_min_samples: int = 16  # at least this many samples in a fit, however rarely memory is read
    creep_min_share: float = 0.01  # growth across a fit at least this share of the memory in use
    input_share: float = 0.25  # input wait at least this share of the step time over ``window`` steps
    max_alerts: int = 50  # alerts kept per kind; later ones are counted in ``dropped``

    def __post_init__(self) -> None:
        if self.window < 3 or self.creep_window < 8 or not 8 <= self.creep_min_samples <= self.creep_window:
            raise ValueError("window must be >= 3, creep_window >= 8 and creep_min_samples in 8..creep_window")

    @property
    def memory_every_max(self) -> int:
        """The widest period (steps) memory may be read at for a fit over ``creep_window`` steps to have its
        ``creep_min_samples`` samples: a creep is then judged within one window of steps however dear a
        read is on a loaded machine."""
        return self.creep_window // self.creep_min_samples


# -- pure functions ------------------------------------------------------------------------------------


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of every stretch of True, inclusive."""
    if not mask.size:
        return []
    m = np.concatenate([[False], mask.astype(bool), [False]])
    edges = np.flatnonzero(m[1:] != m[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


def windows(x: np.ndarray, window: int) -> np.ndarray:
    """Every ``window`` consecutive values as rows of a read-only view (len(x) - window + 1 rows)."""
    x = np.ascontiguousarray(x)
    n = len(x) - window + 1
    if n <= 0:
        return np.empty((0, window), dtype=x.dtype)
    return as_strided(x, shape=(n, window), strides=(x.strides[0], x.strides[0]), writeable=False)


def rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """The median of each ``window`` consecutive values, aligned to the last one (len(x) - window + 1 values)."""
    if len(x) < window:
        return np.empty(0)
    k = window // 2
    if window % 2:
        return np.partition(windows(x, window), k, axis=1)[:, k]
    part = np.partition(windows(x, window), (k - 1, k), axis=1)  # np.median's machinery costs more than the work
    return (part[:, k - 1] + part[:, k]) / 2


def rolling_sum(x: np.ndarray, window: int) -> np.ndarray:
    """The sum of each ``window`` consecutive values (len(x) - window + 1 values)."""
    if len(x) < window:
        return np.empty(0)
    c = np.concatenate([[0.0], np.cumsum(x, dtype=np.float64)])
    return c[window:] - c[:-window]


@lru_cache(maxsize=4)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, k=1)
    return i, j


def theil_sen(x: np.ndarray, y: np.ndarray, points: int = FIT_POINTS) -> tuple[float, float]:
    """(slope, intercept): the median of the pairwise slopes, and the median of y - slope * x. More than
    ``points`` points are thinned evenly first (the pairs grow with the square of the points)."""
    if len(x) < 2:
        return 0.0, float(y[0]) if len(y) else 0.0
    if len(x) > points:
        pick = np.linspace(0, len(x) - 1, points).round().astype(np.int64)
        x, y = x[pick], y[pick]
    i, j = _pairs(len(x))
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return 0.0, float(np.median(y))
    slope = float(np.median((y[j] - y[i])[keep] / dx[keep]))
    return slope, float(np.median(y - slope * x))


def creep_fit(steps: np.ndarray, mem: np.ndarray, level: float, min_share: float) -> dict[str, float] | None:
    """The creep figures when memory grows beyond its own noise across ``steps``, else None."""
    if len(steps) < 8:
        return None
    x = steps.astype(np.float64)
    slope, icpt = theil_sen(x, mem)
    if not slope > 0:
        return None
    pick = np.linspace(0, len(x) - 1, min(len(x), FIT_POINTS)).round().astype(np.int64)
    resid = (mem[pick] - (icpt + slope * x[pick])).tolist()
    noise = percentile(resid, 90) - percentile(resid, 10)
    growth = slope * float(x[-1] - x[0])
    if growth <= SLOW_SPREADS * noise or growth <= min_share * level:
        return None
    return {"rate": slope, "growth": growth, "noise": noise, "first": float(x[0]), "last": float(x[-1]),
            "current": float(mem[-1])}


def _ms(value: float, n: int | None = None, source: Source = "measured", note: str | None = None) -> Metric:
    return Metric(value=value, unit="ms", source=source, n=n, note=note)


def _fig(value: float, unit: str, source: Source = "derived", note: str | None = None) -> Metric:
    return Metric(value=value, unit=unit, source=source, note=note)


# -- the streaming analyzer ------------------------------------------------------------------------------


@dataclass
class _Open:
    alert: WatchAlert
    worst: float = 0.0


@dataclass
class _Spike:
    first: int
    last: int
    worst: float
    limit: float
    length: int


@dataclass
class WatchAnalyzer:
    """Fed blocks of series rows in step order (``feed``); keeps the alerts, bounded state, bounded memory."""

    baseline: Baseline
    rules: Rules = field(default_factory=Rules)
    alerts: list[WatchAlert] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        w = self.rules.window
        if self.baseline.n < MIN_SPREAD_SAMPLES:
            self.notes.append(f"no drift or spike judged: the clean window timed {self.baseline.n} step(s), fewer "
                              f"than the {MIN_SPREAD_SAMPLES} a spread needs (analysis/noise.py)")
        self._med_ms = self.baseline.step_s_median * 1e3
        self._spread_ms = self.baseline.step_s_spread * 1e3
        self._drift_limit = window_slow_limit_ms(self._med_ms, self._spread_ms)
        # A step beyond these may be where an alert begins (the drift limit; a wait of input_share of the
        # clean step): the watch feeds the detectors sooner after one (windows/watch.py), else on its budget.
        self.unusual_step_s = self._drift_limit / 1e3 if self.baseline.n >= MIN_SPREAD_SAMPLES else math.inf
        self.unusual_wait_s = self.rules.input_share * self.baseline.step_s_median
        self._hist = {k: np.empty(0) for k in ("step", "x", "wait")}  # the last window - 1 rows
        self._hist_len = w - 1
        self._open: dict[str, _Open] = {}
        self._spike: _Spike | None = None
        self._spikes_pending: list[_Spike] = []
        self._wait_clock: str | None = None
        self._mem_col: str | None = None
        # (step, memory) samples: the last fit's worth, and every _thin_every-th of the whole watch
        self._recent: deque[tuple[float, float]] = deque()
        self._thin: list[tuple[float, float]] = []
        self._thin_every = 1
        self._thin_seen = 0
        self._since_fit = 0
        self._fits = 0
        self._creep_seen = 0
        self._per_fit: int | None = None  # samples in a fit, set by the first ones (_samples_per_fit)
        self._first: list[tuple[float, float]] = []
        # Steps that also ran an evaluation or saved a checkpoint (set_aside): their extra time is that known
        # work, so they are no spike; kept only until judged (bounded), counted for the note.
        self._aside: set[int] = set()
        self._aside_seen = 0
        self._aside_worst_ms = 0.0

    def set_aside(self, step: int) -> None:
        """``step`` also ran an evaluation or saved a checkpoint (the watch saw a no-grad forward of the
        model, or ``torch.save``): a slow step there is that work, not a spike."""
        self._aside.add(step)
        self._aside_seen += 1

    def is_open(self, kind: str) -> bool:
        """Whether an alert of ``kind`` is open (its condition held at the last row fed)."""
        return kind in self._open

    # -- feeding --------------------------------------------------------------------------------------

    def feed(self, rows: Columns) -> list[WatchAlert]:
        """Judge new rows; return the alerts they opened (those a capture may be asked for)."""
        if not len(rows.get("step", ())):
            return []
        before = len(self.alerts)
        steps = np.asarray(rows["step"], dtype=np.int64)
        own = np.asarray(rows["own_s"], dtype=np.float64)
        own = np.where(np.isnan(own), 0.0, own)
        step_ms = np.asarray(rows["step_s"], dtype=np.float64) * 1e3
        x = np.maximum(step_ms - own * 1e3, 0.0)
        wait = self._wait(rows) * 1e3
        h = self._hist
        s_all = np.concatenate([h["step"], steps.astype(np.float64)])
        x_all = np.concatenate([h["x"], x])
        w_all = np.concatenate([h["wait"], wait])
        first_new = len(h["x"])
        self._drift_and_spikes(s_all, x_all, first_new)
        self._input(s_all, w_all, x_all, first_new)
        self._memory(steps, rows)
        k = self._hist_len
        self._hist = {"step": s_all[-k:], "x": x_all[-k:], "wait": w_all[-k:]}
        return self.alerts[before:]

    def finish(self) -> list[WatchAlert]:
        """Every alert; those whose condition still held at the last step stay ``ongoing``."""
        if self._spike is not None:
            self._end_spike(self._spike, self.rules.window // 2)
        self._decide_spikes(None)
        if self._since_fit:  # the samples since the last fit: the recent stretch up to the last step
            fits = self._fits
            self._fit(thin=False)
            self._fits = fits
        if self._aside_seen:
            self.notes.append(f"{self._aside_seen} watched step(s) also ran an evaluation or saved a checkpoint: not "
                              "taken for spikes, their extra time being that work"
                              + (f" (the slowest above its neighbours' median: {self._aside_worst_ms:.3g} ms)"
                                 if self._aside_worst_ms else ""))
        return self.alerts

    # -- each detector ----------------------------------------------------------------------------------

    def _add(self, kind: str, alert: WatchAlert) -> _Open:
        """Keep ``alert`` as the open one of its kind (in the list unless the kind's cap is reached)."""
        kept = sum(1 for a in self.alerts if a.kind == alert.kind)
        if kept >= self.rules.max_alerts:
            self.dropped[alert.kind] = self.dropped.get(alert.kind, 0) + 1
        else:
            self.alerts.append(alert)
        o = self._open[kind] = _Open(alert)
        return o

    def _drift_and_spikes(self, s: np.ndarray, x: np.ndarray, first_new: int) -> None:
        if self.baseline.n < MIN_SPREAD_SAMPLES:
            return  # the clean steps' spread is unknown: no limit to judge a step or a window by
        w = self.rules.window
        rm = rolling_median(x, w)  # rm[k]: the median of x[k : k + w], which ends at row k + w - 1
        med_at = np.full(len(x), self._med_ms)
        if len(rm):
            med_at[w - 1:] = np.maximum(rm, self._med_ms)
        new = np.arange(max(first_new, w - 1), len(x))
        if len(new):
            self._drift_runs(s, x, rm, new, rm[new - (w - 1)] > self._drift_limit)
        self._spikes(s, x, med_at, first_new)

    def _drift_runs(self, s: np.ndarray, x: np.ndarray, rm: np.ndarray, new: np.ndarray, above: np.ndarray) -> None:
        w, limit = self.rules.window, self._drift_limit
        for a, b, o in self._stretches("drift", above):
            j0, j1 = int(new[a]), int(new[b])
            if o is None:
                # Where the slow stretch began: the first step of the window above the limit from which on
                # the steps' median is above it too.
                first = next((i for i in range(j0 - w + 1, j0 + 1)
                              if x[i] > limit and np.median(x[i:j0 + 1]) > limit), j0)
                o = self._add("drift", WatchAlert(
                    kind="drift", first_step=int(s[first]), last_step=int(s[j1]), message="", ongoing=True,
                    evidence={"baseline_step": _ms(self._med_ms, self.baseline.n),
                              "rolling_median": _ms(float(rm[j0 - w + 1]), w, note="when the alert was raised"),
                              "limit": _ms(limit, source="derived",
                                           note="the slowest clean step + their own spread, and >= 5% above their "
                                                "median (analysis/noise.py)")}))
            o.worst = max(o.worst, float(rm[j0 - w + 1:j1 - w + 2].max()))
            o.alert.last_step = int(s[j1])
            self._drift_words(o)

    def _stretches(self, kind: str, above: np.ndarray) -> Iterator[tuple[int, int, _Open | None]]:
        """Each stretch of True in ``above`` (new rows in order) with the open alert of ``kind`` it continues
        (None: it begins here, the caller opens one); an alert is closed where its stretch ends."""
        if kind in self._open and not above[0]:
            self._close(kind)
        for a, b in runs(above):
            yield a, b, self._open.get(kind)
            if b < len(above) - 1:
                self._close(kind)

    def _drift_words(self, o: _Open) -> None:
        a, w = o.alert, self.rules.window
        a.evidence["worst_rolling_median"] = _ms(o.worst, w)
        a.evidence["slowdown"] = _fig(o.worst / self._med_ms, "x")
        a.message = (f"step time drifted from step {a.first_step}: the median of {w} steps reached {o.worst:.3g} ms "
                     f"against the clean {self._med_ms:.3g} ms ({o.worst / self._med_ms:.2f}x; beyond the clean "
                     f"steps' own spread, limit {self._drift_limit:.3g} ms)")

    def _spikes(self, s: np.ndarray, x: np.ndarray, med_at: np.ndarray, first_new: int) -> None:
        """Stretches of at most window // 2 steps above the 'much slower' limit around the rolling median.
        Only steps above that median can be above the limit, so only they are looked at one by one. A
        stretch is reported once ``window`` more steps have passed without a drift around it: the first
        steps of a lasting slowdown look like a spike until the rolling median catches up."""
        half = self.rules.window // 2
        prev = first_new - 1
        if self._aside:
            self._aside = {a for a in self._aside if a >= int(s[first_new])}  # the earlier ones were judged
        for j in np.flatnonzero(x[first_new:] > med_at[first_new:]) + first_new:
            if int(s[j]) in self._aside:  # known work (an evaluation, a checkpoint): ends a stretch, opens none
                self._aside_worst_ms = max(self._aside_worst_ms, float(x[j]))
                continue
            sp = self._spike
            if sp is not None and j > prev + 1:  # a step at or below the median came between: the stretch ended
                self._end_spike(sp, half)
                sp = None
            prev = int(j)
            lim = step_slow_limit_ms(float(med_at[j]), self._spread_ms, 0.0)
            if x[j] > lim:
                if sp is None:
                    self._spike = _Spike(int(s[j]), int(s[j]), float(x[j]), lim, 1)
                else:
                    sp.last, sp.worst, sp.length = int(s[j]), max(sp.worst, float(x[j])), sp.length + 1
            elif sp is not None:
                self._end_spike(sp, half)
        if self._spike is not None and prev < len(x) - 1:
            self._end_spike(self._spike, half)
        if len(s):
            self._decide_spikes(int(s[-1]))

    def _end_spike(self, sp: _Spike, half: int) -> None:
        if sp.length <= half:
            self._spikes_pending.append(sp)
        self._spike = None

    def _decide_spikes(self, seen: int | None) -> None:
        """Report the pending stretches ``window`` steps behind ``seen`` (all when None) that no drift covers."""
        w = self.rules.window
        keep = []
        for sp in self._spikes_pending:
            if seen is not None and seen < sp.last + w:
                keep.append(sp)
            elif not any(a <= sp.last + w and b >= sp.first for a, b in self._drift_spans()):
                self._spike_alert(sp)
        self._spikes_pending = keep

    def _drift_spans(self) -> list[tuple[int, int]]:
        o = self._open.get("drift")
        spans = [(a.first_step, a.last_step) for a in self.alerts if a.kind == "drift"]
        return spans + ([(o.alert.first_step, o.alert.last_step)] if o is not None else [])

    def _spike_alert(self, sp: _Spike) -> None:
        n = sp.last - sp.first + 1
        self._add("spike", WatchAlert(
            kind="spike", first_step=sp.first, last_step=sp.last,
            message=(f"{'step' if n == 1 else f'{n} steps'} {sp.first}{'' if n == 1 else f'-{sp.last}'} took up to "
                     f"{sp.worst:.3g} ms against a median {self._med_ms:.3g} ms ({sp.worst / self._med_ms:.2f}x; "
                     f"limit {sp.limit:.3g} ms)"),
            evidence={"worst_step": _ms(sp.worst), "baseline_step": _ms(self._med_ms, self.baseline.n),
                      "limit": _ms(sp.limit, source="derived",
                                   note="a step 'much slower' than the clean steps (analysis/noise.py)"),
                      "steps": _fig(float(n), "count", "measured")}))
        self._open.pop("spike", None)  # a spike is over when it is reported

    def _wait(self, rows: Columns) -> np.ndarray:
        """The input wait per row, seconds: the device's idle time where it was measured, else the host's."""
        stall = np.asarray(rows.get("input_stall_s", np.full(len(rows["step"]), np.nan)), dtype=np.float64)
        host = np.asarray(rows.get("input_wait_s", np.full(len(rows["step"]), np.nan)), dtype=np.float64)
        if self._wait_clock is None and (np.isfinite(stall).any() or np.isfinite(host).any()):
            self._wait_clock = "device" if np.isfinite(stall).any() else "host"
        return stall if self._wait_clock == "device" else host

    def _input(self, s: np.ndarray, wait: np.ndarray, step_ms: np.ndarray, first_new: int) -> None:
        w, share_limit = self.rules.window, self.rules.input_share
        if len(wait) < w:
            return
        known = np.isfinite(wait)
        w0 = np.where(known, wait, 0.0)
        wsum = rolling_sum(w0, w)  # window k covers rows k .. k + w - 1
        ssum = rolling_sum(step_ms, w)
        nknown = rolling_sum(known.astype(np.float64), w)
        share = np.where((nknown * 2 > w) & (ssum > 0), wsum / np.maximum(ssum, 1e-12), 0.0)
        own_share = np.where(step_ms > 0, w0 / np.maximum(step_ms, 1e-12), 0.0)
        new = np.arange(max(first_new, w - 1), len(wait)) - (w - 1)
        if not len(new):
            return
        for a, b, o in self._stretches("input_bound", share[new] >= share_limit):
            k0, k1 = int(new[a]), int(new[b])
            if o is None:
                # The stretch begins at the first step of the first window above whose own wait is above too.
                waiting = np.flatnonzero(own_share[k0:k0 + w] >= share_limit)
                first = k0 + (int(waiting[0]) if len(waiting) else 0)
                o = self._add("input_bound", WatchAlert(kind="input_bound", first_step=int(s[first]),
                                                        last_step=int(s[k1 + w - 1]), message="", ongoing=True))
            o.worst = max(o.worst, float(share[k0:k1 + 1].max()))
            self._input_words(o, float(wsum[k1] / max(int(nknown[k1]), 1)), float(ssum[k1] / w), int(nknown[k1]),
                              int(s[k1 + w - 1]))

    def _input_words(self, o: _Open, mean_wait: float, mean_step: float, n: int, last: int) -> None:
        a, w, clock = o.alert, self.rules.window, self._wait_clock
        a.last_step = last
        a.evidence = {"input_share": _fig(100 * o.worst, "%", note=f"highest share of the step over {w} steps"),
                      "input_wait": _ms(mean_wait, n, note=f"{clock} clock, mean over the last {w} steps"),
                      "step": _ms(mean_step, w, note=f"mean over the last {w} steps"),
                      "limit": _fig(100 * self.rules.input_share, "%", "derived")}
        if self.baseline.input_wait_s is not None:
            a.evidence["baseline_input_wait"] = _ms(self.baseline.input_wait_s * 1e3, self.baseline.n)
        a.message = (f"input-bound from step {a.first_step}: waiting for input took up to {100 * o.worst:.0f}% of the "
                     f"step over {w} steps (lately {mean_wait:.3g} ms of {mean_step:.3g} ms, {clock} clock)")

    def _memory(self, steps: np.ndarray, rows: Columns) -> None:
        if self._mem_col is None:
            for name in ("mem_allocated_B", "rss_B"):
                if name in rows and np.isfinite(np.asarray(rows[name], dtype=np.float64)).any():
                    self._mem_col = name
                    break
            else:
                return
        col = rows.get(self._mem_col)
        if col is None:
            return
        # Plain lists, not numpy, until a fit: a feed brings a few samples, and each numpy call made right
        # after a training step (cold caches) costs 10-20 µs; the watch feeds its detectors inside the loop.
        samples = [(float(x), y) for x, y in zip(steps.tolist(), np.asarray(col, dtype=np.float64).tolist())
                   if math.isfinite(y)]
        if self._per_fit is None:  # the first samples set how many a fit takes
            self._first += samples
            if len(self._first) < FIRST_SAMPLES:
                return
            self._per_fit = self._samples_per_fit([x for x, _ in self._first])
            samples, self._first = self._first, []
            self._recent = deque(maxlen=self._per_fit)
        # Memory creeps slowly: one fit per half window of samples, the recent stretch and the thinned whole
        # watch in turn. The samples are taken one by one, so the fits (and the alerts) do not depend on
        # how often the caller feeds.
        half, keep = self._per_fit // 2, 2 * self._per_fit
        for xy in samples:
            self._recent.append(xy)
            if self._thin_seen % self._thin_every == 0:
                self._thin.append(xy)
                if len(self._thin) > keep:
                    self._thin = self._thin[::2]
                    self._thin_every *= 2
            self._thin_seen += 1
            self._since_fit += 1
            if self._since_fit >= half:
                self._fit(thin=self._fits % 2 == 1)

    def _samples_per_fit(self, xs: list[float]) -> int:
        """The samples of ``creep_window`` steps, from the steps between the first samples (the watch settles
        its reading period in its first steps), at least ``creep_min_samples``."""
        r = self.rules
        every = float(np.median(np.diff(xs[:FIRST_SAMPLES]))) if len(xs) > 1 else 1.0
        return int(min(r.creep_window, max(r.creep_min_samples, r.creep_window // max(every, 1.0))))

    def _fit(self, thin: bool) -> None:
        n = self._per_fit or self.rules.creep_window
        self._since_fit = 0
        self._fits += 1
        picked = self._thin if thin else self._recent
        if len(picked) < n:
            return
        xs, ys = np.array(picked, dtype=np.float64).T
        level = self.baseline.memory_bytes or float(np.median([y for _, y in self._recent]))
        f = creep_fit(xs, ys, level, self.rules.creep_min_share)
        if f is not None:
            where = f"{len(xs)} samples thinned from the whole watch" if thin else f"the last {n} memory samples"
            self._creep_alert(where, f)
            self._creep_seen = self._fits
        elif "memory_creep" in self._open and self._fits - self._creep_seen >= 2:
            self._close("memory_creep")  # neither fit found it any more

    def _creep_alert(self, where: str, f: dict[str, float]) -> None:
        o = self._open.get("memory_creep")
        if o is None:
            o = self._add("memory_creep", WatchAlert(kind="memory_creep", first_step=int(f["first"]),
                                                     last_step=int(f["last"]), message="", ongoing=True))
        a = o.alert
        a.first_step, a.last_step = min(a.first_step, int(f["first"])), max(a.last_step, int(f["last"]))
        a.evidence = {"rate": _fig(f["rate"], "B/step", note=f"Theil-Sen slope over {where}"),
                      "growth": _fig(f["growth"], "B", note=f"steps {int(f['first'])}-{int(f['last'])}"),
                      "noise": _fig(f["noise"], "B", note="p90 - p10 of the memory around the fitted line"),
                      "memory": _fig(f["current"], "B", "measured", note=self._mem_col)}
        if self.baseline.memory_bytes is not None:
            a.evidence["baseline_memory"] = _fig(self.baseline.memory_bytes, "B", "measured")
        full = ""
        cap = self.baseline.memory_capacity_bytes
        if cap is not None and cap > f["current"]:
            steps_left = (cap - f["current"]) / f["rate"]
            a.evidence["steps_to_full"] = _fig(steps_left, "count", note="at this rate, to the device's memory")
            full = f"; at this rate the device is full in about {steps_left:,.0f} steps"
        a.message = (f"memory grows {f['rate']:,.0f} B/step: {si(f['growth'], 'B')} over steps {int(f['first'])}-"
                     f"{int(f['last'])} ({where}), beyond its own noise ({si(f['noise'], 'B')}){full}")

    def _close(self, kind: str) -> None:
        o = self._open.pop(kind, None)
        if o is not None:
            o.alert.ongoing = False


def analyze_series(rows: Columns, baseline: Baseline, rules: Rules | None = None,
                   chunk: int = 4096) -> tuple[list[WatchAlert], dict[str, int]]:
    """Every alert of a whole series (post hoc: the same analyzer fed in chunks), and those dropped per kind."""
    an = WatchAnalyzer(baseline, rules or Rules())
    n = len(rows["step"])
    for a in range(0, n, chunk):
        an.feed({k: np.asarray(v)[a:a + chunk] for k, v in rows.items()})
    return an.finish(), dict(an.dropped)


# -- across ranks ----------------------------------------------------------------------------------------


def stragglers(per_rank: Mapping[int, tuple[Sequence[int], Sequence[float]]], *, figure: str, step_s: float,
               window: int = Rules.window) -> list[WatchAlert]:
    """Ranks whose rolling median of ``figure`` (seconds per step, e.g. the input wait) is beyond the other
    ranks' by the drift rule (their median over the window, their own spread: slowest - median) and by at
    least FAST_MIN_SHARE of the step time ``step_s``. ``per_rank``: rank -> (steps, values); steps all ranks
    share are compared."""
    if len(per_rank) < 2:
        return []
    common = None
    for steps, _ in per_rank.values():
        common = set(int(s) for s in steps) if common is None else common & set(int(s) for s in steps)
    order = np.array(sorted(common or ()), dtype=np.int64)
    if len(order) < window:
        return []
    ranks = sorted(per_rank)
    table = np.empty((len(ranks), len(order)))
    for r_i, r in enumerate(ranks):
        steps, vals = per_rank[r]
        lookup = dict(zip((int(s) for s in steps), (float(v) for v in vals)))
        table[r_i] = [lookup[int(s)] * 1e3 for s in order]
    floor_ms = FAST_MIN_SHARE * step_s * 1e3
    alerts = []
    for r_i, r in enumerate(ranks):
        others = np.delete(table, r_i, axis=0)
        mine = rolling_median(table[r_i], window)
        pooled = np.concatenate([windows(o, window) for o in others], axis=1)  # (k, (ranks-1) * window)
        med = np.median(pooled, axis=1)
        limit = np.array([window_slow_limit_ms(m, s) for m, s in zip(med, pooled.max(axis=1) - med)])
        behind = (mine > limit) & (mine - med > floor_ms)
        for a, b in runs(behind):
            k = a + int(np.argmax(mine[a:b + 1] - med[a:b + 1]))
            if not math.isfinite(mine[k]):
                continue
            alerts.append(WatchAlert(
                kind="straggler", first_step=int(order[a]), last_step=int(order[b + window - 1]),
                message=(f"rank {r} fell behind from step {int(order[a])}: its {figure} (median of {window} steps) "
                         f"was {mine[k]:.3g} ms against {med[k]:.3g} ms on the other ranks (limit {limit[k]:.3g} ms)"),
                evidence={"rank": _fig(float(r), "count", "measured"), "figure": _fig(mine[k], "ms", "measured",
                                                                                       note=figure),
                          "others": _ms(float(med[k]), len(ranks) - 1, note=f"median of the other ranks' {figure}"),
                          "limit": _ms(float(limit[k]), source="derived")}))
    return alerts

