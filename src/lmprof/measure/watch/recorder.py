"""The whole-run recorder: one fixed-size row per step after the measured window, at a few µs a step.

Per step the host clock is read once at the boundary (no device sync); on CUDA an event is recorded
there and read back once the device has passed it (``event.query()`` when the next steps end, never
a wait); memory comes from the allocator's own counters and /proc/self/statm. Rows live in typed
numpy columns of fixed capacity (``chunk_rows`` + ``max_pending``) and are spilled to a Parquet chunk
when ``chunk_rows`` of them are complete or ``flush_every_s`` has passed, so memory stays bounded
however long the run is, and a crash loses at most the rows since the last spill (a clean end, an
exception or a SIGTERM handled by the caller spills them: :meth:`Watcher.close` / :meth:`abort`).

The protocol drives it (docs/user-code.md, "Watching the whole run"):

    w = Watcher(run_folder / "watch", device=dev, tokens_per_step=..., step_s_hint=baseline.step_s_median)
    w.start(step)                 # at the boundary that ends the measured window
    w.forward_start()             # the step's first forward begins (optional: input wait)
    w.report_loss(loss)           # optional, or step_end(loss=...)
    w.step_end(tokens=..., loss=...)   # at each step boundary (the optimizer step ended)
    w.skip()                      # or: a boundary whose step stays out of the series (a captured window)
    rows = w.take()               # complete rows since the last take (detectors, the watch's lines)
    w.recorded()                  # what is on disk so far (for watch/watch.json when an alert changes)
    recorded = w.close()          # the script ended; abort() on a signal or crash (no waiting)
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from lmprof.atomic import WriteError
from lmprof.measure.watch.device import (
    NAN, DeviceTimer, MemoryReader, ProcRss, device_edges, period_for, read_cost_s,
)
from lmprof.measure.watch.spill import SeriesWriter
from lmprof.record.watch import SERIES_COLUMNS, Baseline, StepSummary, WatchSection

if TYPE_CHECKING:  # a loss tensor can only come from a program that imported torch: the watch itself needs none
    import torch

AUTO: Any = object()  # a default that means "what this device has"
# Reading memory may take this share of a step at most (CUDA's counters, and /proc/self/statm's read,
# cost tens of µs right after a step): the watch as a whole is held to 1% of a 10 ms step.
MEMORY_SHARE = 0.0005
# Steps whose device marks wait before the recorder asks the device about them (a query each, cold).
POLL_AT = 8
# How long close() waits for the device to pass the last boundary events before giving up on them.
CLOSE_WAIT_S = 2.0

Rows = dict[str, np.ndarray]


@dataclass
class Recorded:
    """What a watch left on disk, for the run's ``watch`` section."""

    series: list[Path]
    steps: int
    first_step: int | None
    last_step: int | None
    device_time: str | None
    notes: list[str] = field(default_factory=list)

    def section(self, run_folder: str | Path, baseline: Baseline | None = None, **more: Any) -> WatchSection:
        """The run.json section: series paths relative to ``run_folder``; alerts and captures in ``more``."""
        base = Path(run_folder).resolve()
        files = [p.resolve().relative_to(base).as_posix() for p in self.series]
        notes = [*self.notes, *more.pop("notes", [])]
        return WatchSection(series=files, steps=self.steps, first_step=self.first_step, last_step=self.last_step,
                            baseline=baseline, device_time=self.device_time, notes=notes, **more)


class Watcher:
    """Records every step after the measured window (see the module docstring for the calls)."""

    def __init__(self, out_dir: str | Path, *, device: torch.device | str = "cpu",
                 tokens_per_step: float | None = None, step_s_hint: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, timer: DeviceTimer | None = AUTO,
                 memory: MemoryReader | None = AUTO, chunk_rows: int = 16384, flush_every_s: float = 300.0,
                 max_pending: int = 256, memory_every: int | None = None, memory_every_max: int | None = None):
        if chunk_rows < 1 or max_pending < 1 or not flush_every_s > 0:
            raise ValueError("chunk_rows and max_pending must be >= 1, flush_every_s > 0")
        self._writer = SeriesWriter(out_dir)  # ConfigError without pyarrow, before anything runs
        self._rss = ProcRss()
        auto_timer, auto_mem, note = device_edges(device, self._rss)
        self._timer: DeviceTimer | None = auto_timer if timer is AUTO else timer
        self._mem: MemoryReader | None = auto_mem if memory is AUTO else memory
        self.device_time = note if timer is AUTO else (None if timer is not None else "n/a: no device clock given")
        self.tokens_per_step = tokens_per_step
        self.step_s_hint = step_s_hint
        self.clock = clock
        self.chunk_rows, self.flush_every_s, self.max_pending = chunk_rows, flush_every_s, max_pending
        self.memory_every = memory_every
        self._adapt = memory_every is None  # the period follows the reads' own cost, as measured in the loop
        self._every_max = memory_every_max  # ... but no wider than this (the creep detector's samples)
        self._read_costs: deque[float] = deque(maxlen=5)
        self._widest = 1  # the longest period the memory was read at (the record says it)
        cap = chunk_rows + max_pending
        # Every column starts at what a step leaves it at unless it writes it (NaN, or the run's tokens per
        # step): a step writes only its own figures, a few stores rather than twelve (the per-step cost).
        self._blank = {c.name: (tokens_per_step or NAN) if c.name == "tokens" else NAN if c.dtype == "float64" else 0
                       for c in SERIES_COLUMNS}
        self._cols: Rows = {c.name: np.full(cap, self._blank[c.name], dtype=c.dtype) for c in SERIES_COLUMNS}
        self._n = 0  # rows in the columns
        self._staged: list[tuple[Any, ...]] = []  # rows after them, not yet written into the columns
        self._cap = cap
        self._taken = 0  # rows of the buffer handed out by take()
        self._consumer = False  # take() has been called: spilled rows it has not seen wait in _overflow
        self._overflow: list[Rows] = []
        self._spilled_last: Rows | None = None
        # (row, start mark, end mark, forward mark, staged loss): rows whose device figures are not read yet
        self._pending: deque[tuple[int, Any, Any, Any, Any]] = deque()
        self._on = False
        self._pid = os.getpid()
        self._t0 = self._prev_t = self._last_flush = 0.0
        self._fwd_t: float | None = None
        self._prev_mark: Any = None
        self._fwd_mark: Any = None
        self._loss: Any = None
        self._own = 0.0
        self._mem_in = 0
        self._step = 0
        self.steps = 0
        # the last row's step time as the detectors see it (own time out) and input wait (NaN: no forward), s
        self.last_step_s, self.last_wait_s = 0.0, NAN
        self.skipped = 0  # boundaries left out of the series (skip())
        self.first_step: int | None = None
        self.device_dropped = 0
        self.untaken = 0
        self.failed: str | None = None
        self.notes: list[str] = []

    # -- the calls the protocol makes ---------------------------------------------------------------

    def start(self, step: int) -> None:
        """Begin at a step boundary: ``step`` is the index of the first watched step."""
        if self.memory_every is None:
            self._read_costs.append(read_cost_s(self._mem, self.clock) if self._mem is not None else 0.0)
            self._mem_period()
        self._step = self.first_step = step
        self._on = True
        t = self.clock()
        self._t0 = self._prev_t = self._last_flush = t
        if self._timer is not None:
            self._prev_mark = self._timer.mark()

    def forward_start(self) -> None:
        """The step's first forward begins (later calls in the same step are ignored)."""
        if self._fwd_t is None and self._on:
            # lmprof's own time at the boundary (billed so far) is not the program's wait for input
            self._fwd_t = self.clock() - self._own
            if self._timer is not None:
                self._fwd_mark = self._timer.mark()

    def report_loss(self, value: float | torch.Tensor) -> None:
        """The script's loss for the current step (a device tensor is read later, never waited for)."""
        self._loss = value

    def step_end(self, tokens: float | None = None, loss: float | torch.Tensor | None = None) -> None:
        """A step boundary: the step that began at the previous one ends here."""
        t = self.clock()
        if not self._on:
            return
        i = self._n + len(self._staged)
        if i == self._cap:
            self._make_room(t)
            if not self._on:  # the spill that made room failed: the watch has stopped
                return
            i = self._n
        value, staged = NAN, None
        if loss is not None or self._loss is not None:
            value, staged = self._loss_now(loss if loss is not None else self._loss)
            self._loss = None
        mem = None
        self._mem_in -= 1
        if self._mem is not None and self._mem_in <= 0:
            t_read = self.clock()
            mem = self._mem.read()
            if self._adapt:
                self._read_costs.append(self.clock() - t_read)
                self._mem_period()
            self._mem_in = self.memory_every or 1
        step_s = t - self._prev_t
        wait = NAN if self._fwd_t is None else self._fwd_t - self._prev_t
        # A tuple in a list: numpy's item stores cost about 2 µs each right after a training step (cold
        # caches), and a step has eight figures; they go into the columns a block at a time (_commit).
        self._staged.append((self._step, t - self._t0, step_s, wait, tokens, self._own, value, mem))
        if self._timer is not None:
            end = self._timer.mark()  # after the loss copy, so the copy is done when this mark is
            self._pending.append((i, self._prev_mark, end, self._fwd_mark, staged))
            self._prev_mark = end
            if len(self._pending) >= POLL_AT:
                self._poll()
        self.last_step_s, self.last_wait_s = step_s - self._own, wait  # for a caller's look at the step
        self._prev_t, self._fwd_t, self._fwd_mark = t, None, None
        self._step += 1
        self.steps += 1
        if self._ready() >= self.chunk_rows or t - self._last_flush >= self.flush_every_s:
            self._spill(t)
        self._own = self.clock() - t

    def _commit(self) -> None:
        """Move the staged rows into the columns."""
        rows, self._staged = self._staged, []
        if not rows:
            return
        a, b = self._n, self._n + len(rows)
        c = self._cols
        step, t_s, step_s, wait, tokens, own, loss, mem = zip(*rows)
        c["step"][a:b], c["t_s"][a:b], c["step_s"][a:b] = step, t_s, step_s
        c["input_wait_s"][a:b], c["own_s"][a:b], c["loss"][a:b] = wait, own, loss
        for k, v in enumerate(tokens):
            if v is not None:
                c["tokens"][a + k] = v
        for k, m in enumerate(mem):
            if m is not None:
                c["mem_allocated_B"][a + k], c["mem_reserved_B"][a + k], c["rss_B"][a + k] = m
        self._n = b

    def skip(self) -> None:
        """A step boundary whose step is left out of the series (a captured window profiled it, or the
        user's own profiler ran in it): no row, and the next step starts here."""
        t = self.clock()
        if not self._on:
            return
        if self._timer is not None:
            self._prev_mark = self._timer.mark()
        self._prev_t, self._fwd_t, self._fwd_mark, self._loss = t, None, None, None
        self._step += 1
        self.skipped += 1
        self._own = self.clock() - t

    def add_own(self, seconds: float) -> None:
        """Bill time the caller spent on the watch's behalf (detectors, panel) to the current step's own_s."""
        self._own += seconds

    def take(self) -> Rows | None:
        """Copies of the complete rows since the last take (None when there are none)."""
        self._commit()
        if self._timer is not None:
            self._poll()
        self._consumer = True
        ready = self._ready()
        parts, self._overflow = self._overflow, []
        if ready > self._taken:
            parts.append({k: v[self._taken:ready].copy() for k, v in self._cols.items()})
            self._taken = ready
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def latest(self) -> StepSummary | None:
        """The last step's summary (its device time may still be pending: None then)."""
        self._commit()
        if self._n:
            return StepSummary.from_row(self._cols, self._n - 1)
        return None if self._spilled_last is None else StepSummary.from_row(self._spilled_last)

    def recorded(self) -> Recorded:
        """What is on disk so far (the chunks spilled up to now), for ``watch/watch.json`` mid-run."""
        notes = list(dict.fromkeys(self.notes))
        if self._widest > 1:
            notes.append(f"memory read every {self._widest} steps at most (a read may cost {100 * MEMORY_SHARE:g}% of "
                         "a step, its cost measured in the loop)")
        return Recorded(series=list(self._writer.written), steps=self.steps, first_step=self.first_step,
                        last_step=self._last_step(), device_time=self.device_time, notes=notes)

    def _mem_period(self) -> None:
        """The memory read's period from its last costs (their median: one slow read is no rule)."""
        costs = sorted(self._read_costs)
        self.memory_every = period_for(costs[len(costs) // 2], self.step_s_hint, MEMORY_SHARE)
        if self._every_max is not None:
            self.memory_every = min(self.memory_every, self._every_max)
        self._widest = max(self._widest, self.memory_every)

    def _last_step(self) -> int | None:
        return None if self.first_step is None or not self.steps else self._step - 1

    def close(self) -> Recorded:
        """The script ended: wait briefly for the device's last marks, spill everything, stop."""
        return self._finish(wait_s=CLOSE_WAIT_S)

    def abort(self) -> Recorded:
        """A signal or a crash: spill what is complete now, without waiting for the device."""
        return self._finish(wait_s=0.0)

    # -- inside -------------------------------------------------------------------------------------

    def _loss_now(self, loss: Any) -> tuple[float, Any]:
        """(value now, or NaN with a staged copy to read later)."""
        if isinstance(loss, float):
            return loss, None
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(loss, torch.Tensor):
            # Attributes rather than loss.device.type and numel(): this runs in every step, right after it.
            if loss.is_cpu:
                try:
                    return float(loss.item()), None  # no autograd; more than one element raises
                except RuntimeError:
                    return NAN, None
            if self._timer is not None and loss.numel() == 1:
                return NAN, self._timer.stage(loss)
            return NAN, None  # a device tensor without a device clock: reading it would wait for the device
        try:
            return float(loss), None
        except (TypeError, ValueError):
            return NAN, None

    def _ready(self) -> int:
        return self._pending[0][0] if self._pending else self._n + len(self._staged)

    def _poll(self) -> None:
        timer = self._timer
        assert timer is not None
        while self._pending and timer.done(self._pending[0][2]):
            self._resolve(*self._pending.popleft(), done=True)

    def _resolve(self, i: int, start: Any, end: Any, fwd: Any, staged: Any, *, done: bool) -> None:
        timer = self._timer
        assert timer is not None
        if i >= self._n:
            self._commit()
        c = self._cols
        if done:
            c["device_s"][i] = timer.elapsed_s(start, end)
            if fwd is not None and timer.done(fwd):
                c["input_stall_s"][i] = timer.elapsed_s(start, fwd)
                timer.release(fwd)
            if staged is not None:
                c["loss"][i] = timer.read(staged)
            timer.release(start)  # the next row's start is this row's end: kept
        else:
            self.device_dropped += 1  # left to the garbage collector: the device has not passed it

    def _make_room(self, t: float) -> None:
        """The buffer is full of rows the device has not finished: give up on the oldest device figures."""
        while len(self._pending) > self.max_pending // 2:
            self._resolve(*self._pending.popleft(), done=False)
        self._spill(t)

    def _spill(self, t: float) -> None:
        self._commit()
        ready = self._ready()
        self._last_flush = t
        if ready == 0:
            return
        try:
            self._writer.write({k: v[:ready] for k, v in self._cols.items()})
        except WriteError as exc:
            self.failed = f"the watch stopped at step {self._step}: {exc}"
            self.notes.append(self.failed)
            self._on = False
            return
        if self._consumer and self._taken < ready:
            # Rows the detectors have not seen yet wait for the next take(), at most one chunk of them.
            self._overflow.append({k: v[self._taken:ready].copy() for k, v in self._cols.items()})
            while sum(len(o["step"]) for o in self._overflow) > self.chunk_rows:
                self.untaken += len(self._overflow.pop(0)["step"])
        rest = self._n - ready
        if not rest:  # the buffer empties: keep the last row for latest()
            self._spilled_last = {k: v[ready - 1:ready].copy() for k, v in self._cols.items()}
        for name, v in self._cols.items():
            v[:rest] = v[ready:self._n]
            v[rest:] = self._blank[name]
        self._pending = deque((i - ready, *more) for i, *more in self._pending)
        self._taken = max(0, self._taken - ready)
        self._n = rest

    def _finish(self, wait_s: float) -> Recorded:
        if self._on and os.getpid() == self._pid:
            if self._timer is not None:
                deadline = time.monotonic() + wait_s
                self._poll()
                while self._pending and time.monotonic() < deadline:
                    time.sleep(0.005)
                    self._poll()
                if self._pending:
                    self.notes.append(f"device time n/a for the last {len(self._pending)} step(s): the device had "
                                      "not finished them when the watch closed")
                while self._pending:
                    self._resolve(*self._pending.popleft(), done=False)
            self._on = False
            self._spill(self.clock())
        if isinstance(self._rss, ProcRss):
            self._rss.close()
        if self.device_dropped:
            self.notes.append(f"device time n/a for {self.device_dropped} step(s) the device had not finished "
                              f"within {self.max_pending} steps")
        if self.untaken:
            self.notes.append(f"the detectors missed {self.untaken} step(s): take() was not called for more than "
                              f"{self.chunk_rows} steps")
        return self.recorded()
