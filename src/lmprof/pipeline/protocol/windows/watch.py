"""The whole-run watch: after the profiled window, every step until the run ends (docs/user-code.md,
"Watching the whole run").

Armed from the session's start, it reads the memory in use as the clean window ends and begins at the
boundary that completes the profiled window, with the clean steps as its baseline. From then on each
step boundary the session passes on (``steps_after_window`` keeps its triggers) is one row of the
recorder (measure/watch/), a forward pre-hook on the model marks when the step's first forward begins
(the input wait), and every N steps (N from the detectors' measured cost, 0.05% of a step,
sooner after a few steps in a row beyond the drift limit or waiting long for input) the new
rows go to the detectors (analysis/watch_detect.py), the panel's lines and the door's step sink
(``--log-to``). An alert that a profile of the next steps can explain, SIGUSR2 or a ``capture`` file in
the run folder asks for a capture (windows/watch_capture.py), rate-limited (analysis/watch_capture.py).
``watch/watch.json`` is rewritten when an alert opens or closes or a capture begins or ends, so a run
killed while watched keeps the alerts so far beside the measured window's run.json (written as the
window completed); the run's end closes the series and puts the section into the run
(:class:`WatchResult`), with what grew in each capture against the run's own profiled window.

Nothing of the watch may break the user's program or lose the run measured before it: a failure of
its own ends the watch alone (one line on stderr, a note, the series so far kept), never the session.
Steps under a capture, or under the user's own profiler, stay out of the series (their times are a
profiler's); lmprof's own time inside a step (the detectors, a capture's start and write) is billed to
the next row's ``own_s``, which the detectors take out.
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmprof.analysis.watch_capture import CaptureLimiter, diff_runs
from lmprof.analysis.watch_detect import WatchAnalyzer
from lmprof.atomic import write_text
from lmprof.errors import LmprofError
from lmprof.measure.watch import CaptureRequests, Watcher, period_for
from lmprof.measure.watch.device import ProcRss, device_edges
from lmprof.measure.window import user_profiler_active
from lmprof.pid import this_pid
from lmprof.pipeline.protocol.folder import INCOMPLETE
from lmprof.pipeline.protocol.guard import why
from lmprof.pipeline.protocol.probes import SeenBatches
from lmprof.pipeline.protocol.saves import save_spy
from lmprof.pipeline.protocol.spec import WatchSpec
from lmprof.pipeline.protocol.windows.base import Context, Window
from lmprof.pipeline.protocol.windows.watch_capture import Capture
from lmprof.record.run import Baseline, RequestKind, Run, WatchAlert, WatchCapture, WatchSection
from lmprof.record.watch import WATCH_DIR, StepSummary, save_section
from lmprof.workloads.hf_interface import forward_tokens
from lmprof.workloads.hooks import never_compiled, takes_hooks

if TYPE_CHECKING:
    from lmprof.pipeline.protocol.probes import Probes
    from lmprof.show.watch_panel import WatchPanel

FEED_SHARE = 0.0005  # the detectors, the panel and the sink may take this share of a step
UNUSUAL_RUN = 3  # steps in a row beyond the drift limit (or waiting long for input) that bring a feed forward
FEED_COST_S = 1e-4  # a feed's cost until one is measured: its cost alone (0.5-2 ms in a loop), so the first comes early
SINK_EVERY_S = 1.0  # the step sink (a tracker) gets the latest step at most this often
RECENT = 16  # watched steps a capture's clean figure is the median of
MARK = ("this run is being watched: its record (run.json) is written as the profiled window completes, and again, "
        "with the watch's section, when the script ends\n")
ARMED, WATCHING, STOPPED = "armed", "watching", "stopped"


@dataclass
class WatchResult:
    """What the watch leaves for the run: its section, and the captures' diffs made once the run exists."""

    section: WatchSection

    def add_to(self, run: Run, folder: Path) -> None:
        """Name what grew in each capture against ``run``'s own profiled window, and keep the section."""
        for cap in self.section.captures:
            try:
                cap.grew = diff_runs(run, Run.load(folder / cap.path))
            except Exception as exc:  # noqa: BLE001 - inside the run's assembly: a missing diff, never a lost run
                said = exc if isinstance(exc, LmprofError) else why(exc)
                cap.note = f"no diff against the run's profiled window: {said}"
        run.watch = self.section
        with contextlib.suppress(OSError):
            save_section(folder, self.section)


class WatchWindow(Window):
    """The whole-run watch, started when the profiled window completes (see the module doc)."""

    name = "watch"

    def __init__(self, ctx: Context, spec: WatchSpec):
        super().__init__(ctx)
        self.spec = spec
        self.state = ARMED
        self._pid = os.getpid()
        self._memory0: float | None = None  # memory in use at the clean window's end
        self.folder: Path | None = None
        self.w: Watcher | None = None
        self.an: WatchAnalyzer | None = None
        self.base: Baseline | None = None
        self.limiter = CaptureLimiter(min_gap_steps=spec.min_gap_steps, max_captures=spec.max_captures)
        self.requests: CaptureRequests | None = None
        self.panel: WatchPanel | None = None
        self.capture: Capture | None = None
        self.captures: list[WatchCapture] = []
        self.notes: list[str] = []
        self.section: WatchSection | None = None
        self._hook: Any = None
        self._next = 0  # the index of the step running now
        self._recent: deque[float] = deque(maxlen=RECENT)  # the last watched steps, own time taken out (s)
        self._since_feed = 0
        self._every = 1
        self._soon: int | None = None  # feed when _since_feed reaches this (an unusual step was seen)
        self._unusual_s = self._unusual_wait_s = math.inf
        self._rows_to_judge = 0
        self._calm = 0  # steps before another unusual step may bring a feed forward
        self._unusual_run = 0  # unusual steps in a row, up to the last one
        self._costs: deque[float] = deque([FEED_COST_S], maxlen=9)  # the detectors' last costs per feed (s)
        self._busy = False  # the user's profiler was on at the last boundary
        # The first step after lmprof's profiler stops pays for its teardown (1.4-3.6x a clean step on CPU,
        # with or without DDP): left out of the series, as the steps of a capture are.
        self._settling = True
        self._aside = 0
        self._wanted: tuple[RequestKind, WatchAlert | None] | None = None  # a capture begins at the next boundary
        self._refused: dict[str, int] = {}
        self._captured = 0  # captures begun (their folders' numbers)
        self._sink_at = -math.inf
        self._saved: tuple[Any, ...] = ()
        self._tokens = 0  # the running step's tokens, each distinct batch once (_forward)
        self._batches = SeenBatches()  # the running step's, as the probes count them
        self._step_aside = False  # the running step ran a no-grad forward (an evaluation) or torch.save
        self._saves = save_spy(self._saw_save)  # torch.save, patched while the watch runs

    @property
    def active(self) -> bool:
        return self.state != STOPPED

    @property
    def steps_after_window(self) -> bool:
        return True

    def probes(self) -> Probes | None:
        return self.capture.probes() if self.capture is not None else None

    def report_loss(self, value: Any) -> None:
        """The script's loss for the running step (``prof.step(loss=...)``, Lightning's step output)."""
        if self.w is not None and self.state == WATCHING:
            self.w.report_loss(value)

    # -- before the watch ------------------------------------------------------------------------------
    def step_ends(self, step: int) -> None:
        if self.state != ARMED or this_pid() != self._pid:
            return
        try:
            if self.ctx.plan.clean_ends(step):
                self._memory0 = self._memory_now()
            if self.ctx.plan.window_completes(step):
                self._start(step + 1)
        except Exception as exc:  # noqa: BLE001 - the watch's failure is its own, never the run's
            self._broken(exc)

    def _memory_now(self) -> float | None:
        """Memory in use now: allocated on CUDA, the resident set elsewhere (as the detectors read it)."""
        device = self.ctx.observed.device
        if device is None:
            return None
        rss = ProcRss()
        try:
            allocated, _, resident = device_edges(device.torch_device, rss)[1].read()
        finally:
            rss.close()
        value = allocated if math.isfinite(allocated) else resident
        return value if math.isfinite(value) else None

    def _start(self, first: int) -> None:
        ctx, seen = self.ctx, self.ctx.observed
        steps = ctx.timings.steps
        if not steps:
            steps = ctx.timings.rough_steps.get("profiled", [])
            if steps:
                self.notes.append("no clean step was timed: the watch judges against the profiled steps (the "
                                  "profiler's cost included), so it sees less of a slowdown")
        if not steps or seen.device is None:
            self.state = STOPPED
            seen.notes.append("the watch did not start: no step was timed to judge the later ones against")
            return
        self.folder = folder = ctx.claim_folder()
        write_text(folder / INCOMPLETE, MARK)
        # the probes' count of the distinct batches' token ids per step, as the run's tokens_per_step
        # (before the profiled window has handed it over: the first profiled input's batch x sequence)
        shape = seen.input_shape
        tokens = (round(seen.tokens_per_step) if seen.tokens_per_step
                  else shape[0] * shape[1] if shape and len(shape) == 2 else None)
        # the clean steps' own wait for input (host clock, as the series' input_wait_s): an input_bound
        # alert's evidence sets the later waits beside it
        waits = [w for w in ctx.timings.waits if w is not None]  # clean steps only (rough ones keep no wait)
        self.base = Baseline.from_samples(steps, memory_bytes=self._memory0,
                                          memory_capacity_bytes=_capacity(seen.device.torch_device),
                                          tokens_per_step=tokens, input_wait_s=statistics.median(waits) if waits else None)
        self.an = WatchAnalyzer(self.base)
        self.w = Watcher(folder / WATCH_DIR, device=seen.device.torch_device, tokens_per_step=tokens,
                         step_s_hint=self.base.step_s_median, memory_every_max=self.an.rules.memory_every_max)
        self._unusual_s, self._unusual_wait_s = self.an.unusual_step_s, self.an.unusual_wait_s
        self._rows_to_judge = self.an.rules.window // 2 + 1
        self._every = period_for(FEED_COST_S, self.base.step_s_median, FEED_SHARE)
        self.requests = CaptureRequests(folder)
        if ctx.spec.verbose:
            from lmprof.show.watch_panel import WatchPanel  # rich: only where something is shown

            self.panel = WatchPanel()
        model = seen.model
        if model is not None and takes_hooks(model):
            self._hook = model.register_forward_pre_hook(never_compiled(self._forward), prepend=True, with_kwargs=True)
        self._saves.install()
        self._next = first
        self.state = WATCHING
        self.w.start(first)  # the first watched step begins (left out of the series: the profiler's teardown)
        self.w.take()  # the detectors take every row: a spill keeps those they have not seen yet
        self._save()
        if self.panel is not None:
            ask = f"kill -USR2 {os.getpid()} or " if self.requests.signals.installed else ""
            self.panel.say(f"watching every step from step {first} (series in {folder / WATCH_DIR}); {ask}touch "
                           f"{folder / 'capture'} to capture a window")

    def _saw_save(self) -> None:
        self._step_aside = True  # a checkpoint in the step: known work, no spike

    def _forward(self, module: Any, args: Any, kwargs: Any) -> None:
        w = self.w
        if w is not None and this_pid() == self._pid:
            if not torch.is_grad_enabled():
                self._step_aside = True  # an evaluation in the step: known work, no spike
            try:
                w.forward_start()
                # the step's own tokens, each batch once (steps may differ: batches padded to their longest)
                batch, tokens = forward_tokens(args, kwargs)
                if tokens is not None and torch.is_grad_enabled() and self._batches.new(batch):
                    self._tokens += tokens[0] * tokens[1]
            except Exception as exc:  # noqa: BLE001 - inside the user's forward
                self._broken(exc)

    # -- each step after the profiled window -------------------------------------------------------------
    def boundary(self) -> None:
        if self.state != WATCHING or this_pid() != self._pid:
            return
        try:
            self._boundary()
        except Exception as exc:  # noqa: BLE001 - the watch's failure is its own, never the run's
            self._broken(exc)

    def _boundary(self) -> None:
        w = self.w
        assert w is not None
        tokens, self._tokens = self._tokens, 0  # the ended step's, counted by _forward
        aside, self._step_aside = self._step_aside, False
        self._batches.clear()
        if self.capture is not None:
            w.skip()
            t0 = w.clock()
            self._next += 1
            self._capture_step(self.capture)
            w.add_own(w.clock() - t0)
            return
        busy = user_profiler_active()
        if busy or self._busy:  # the step began or ended under the user's own profiler: not a clean step
            w.skip()
            self._aside += 1
        elif self._settling:
            w.skip()
            self._settling = False
        else:
            if aside:
                assert self.an is not None
                self.an.set_aside(self._next)
            w.step_end(tokens=tokens or None)
            slow, waited = w.last_step_s > self._unusual_s, w.last_wait_s > self._unusual_wait_s  # NaN: False
            self._unusual_run = self._unusual_run + 1 if (slow or waited) and self._news(slow, waited) else 0
            if self._unusual_run >= UNUSUAL_RUN and self._soon is None and self._calm <= 0:
                # Where an alert may begin (a hiccup is one step, a drift or a starving loader every step): the
                # detectors look once enough rows follow it for a rolling median to cross, not a budget's
                # period later. Not while the alert it would raise is open, and at most once in
                # rows_to_judge + UNUSUAL_RUN steps, so steps that hover at the limit cannot make it a cost.
                self._soon = self._since_feed + self._rows_to_judge - UNUSUAL_RUN
                self._calm = self._rows_to_judge + UNUSUAL_RUN
        self._calm -= 1
        self._busy = busy
        self._next += 1
        t0 = w.clock()
        assert self.requests is not None
        asked = self.requests.poll(time.monotonic())
        if asked is not None:
            self._want(asked, None)
        self._since_feed += 1
        if self._since_feed >= self._every or self._wanted is not None or (self._soon is not None and
                                                                           self._since_feed >= self._soon):
            self._feed()
        if self._wanted is not None and not busy:
            self._begin_capture()
        w.add_own(w.clock() - t0)

    def _news(self, slow: bool, waited: bool) -> bool:
        """Whether a step that was slow or waited long for input could open an alert not open already."""
        an = self.an
        assert an is not None
        return (slow and not an.is_open("drift")) or (waited and not an.is_open("input_bound"))

    def _feed(self) -> None:
        """The rows since the last feed to the detectors, the panel and the sink; captures the alerts ask for."""
        w, an, base = self.w, self.an, self.base
        assert w is not None and an is not None and base is not None
        t0 = w.clock()
        self._since_feed, self._soon = 0, None
        rows = w.take()
        if rows is not None:
            new = an.feed(rows)
            for step_s, own_s in zip(rows["step_s"][-RECENT:].tolist(), rows["own_s"][-RECENT:].tolist()):
                x = step_s - (own_s if math.isfinite(own_s) else 0.0)
                if math.isfinite(x) and x > 0:
                    self._recent.append(x)
            if self.panel is not None or self.spec.sink is not None:
                summary = StepSummary.from_row(rows)
                if self.panel is not None:
                    self.panel.update(summary, new)
                self._stream(summary, t0)
            for a in new:
                if any(a is kept for kept in an.alerts):  # beyond a kind's cap it is counted, not kept
                    self._want("alert", a)
            self._save(changed_only=True)
            # The whole feed's cost, timed in the loop (right after a step the caches are cold: 5-15x its cost
            # timed alone), sets how often it runs: the mean of the last few, as a creep fit every few feeds
            # costs several plain ones.
            self._costs.append(w.clock() - t0)
            self._every = period_for(sum(self._costs) / len(self._costs), base.step_s_median, FEED_SHARE)

    def _stream(self, summary: StepSummary, now: float) -> None:
        sink = self.spec.sink
        if sink is None or now - self._sink_at < SINK_EVERY_S or self.folder is None:
            return
        self._sink_at = now
        try:
            sink.step(self.folder, summary)
        except Exception as exc:  # noqa: BLE001 - a tracker's failure ends the stream, never the run
            self.spec.sink = None
            self._say(f"streaming to the trackers stopped ({why(exc)}); the series is in the run folder")
            self.notes.append(f"--log-to: streaming the watched steps stopped at step {self._next} ({why(exc)})")

    # -- captures --------------------------------------------------------------------------------------
    def _want(self, kind: RequestKind, alert: WatchAlert | None) -> None:
        refused = self.limiter.refuse(self._next, kind, alert)
        if refused is None:
            self._wanted = self._wanted or (kind, alert)
            return
        if kind == "alert" and (alert is None or alert.kind not in self.limiter.kinds or not self.limiter.max_captures):
            return  # an alert of a kind that asks for none, or no captures asked for: nothing was refused
        lim = self.limiter
        rule = (f"the maximum of {lim.max_captures} capture(s) a run" if "maximum" in refused
                else f"the minimum gap of {lim.min_gap_steps} steps between captures alerts ask for")
        self._refused[rule] = self._refused.get(rule, 0) + 1
        if kind != "alert":
            self._say(f"capture asked by {kind} refused: {refused}")

    def _begin_capture(self) -> None:
        assert self._wanted is not None and self.folder is not None and self.an is not None
        kind, alert = self._wanted
        self._wanted = None
        if self.limiter.refuse(self._next, kind, alert) is not None:
            return
        self._captured += 1
        first = self._next + 1  # the running step is the profiler's warm-up
        index = next((i for i, a in enumerate(self.an.alerts) if a is alert), None)
        cap = Capture(self.ctx, self.folder / WATCH_DIR / f"capture-{self._captured}-step{first}", self.folder,
                      first, self.ctx.plan.profile_steps, kind, index)
        self.limiter.begin(self._next)
        try:
            cap.start()
        except Exception as exc:  # noqa: BLE001 - no capture, the watch goes on
            cap.abort()
            self.notes.append(f"capture {self._captured} (asked by {kind}) could not start: {why(exc)}")
            return
        self.capture = cap
        what = f"the {alert.kind.replace('_', ' ')} alert" if alert is not None else f"a {kind}"
        self._say(f"capturing steps {first}-{first + cap.steps - 1} (asked by {what}) into {cap.folder}")
        self._save()

    def _capture_step(self, cap: Capture) -> None:
        """A step of a running capture ended: its next range, or the end (written as a run folder)."""
        where = f"the capture in {WATCH_DIR}/{cap.folder.name}"
        try:
            complete = cap.dropped is None and cap.boundary()
            rec = cap.finish(list(self._recent)) if complete else None
        except Exception as exc:  # noqa: BLE001 - the capture is lost, the watch goes on
            cap.abort()
            cap.dropped = f"it failed ({why(exc)}); its folder holds no run (marked INCOMPLETE)"
            rec = None
        if rec is None and cap.dropped is None:
            return  # the capture goes on
        self.capture = None
        self._settling = True
        if rec is not None:
            self.captures.append(rec)
            self._say(f"captured steps {rec.first_step}-{rec.first_step + rec.steps - 1} into {cap.folder}")
        else:
            self.notes.append(f"{where} was dropped: {cap.dropped}")
            self._say(f"{where} was dropped: {cap.dropped}")
        self._save()

    # -- the end ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """The run ends: close the series, judge the last rows, keep the section for the run."""
        if self.state == ARMED:
            self.state = STOPPED
            self.ctx.observed.notes.append("the watch did not start: the run ended before the profiled window "
                                           "completed")
            return
        if self.state != WATCHING:
            return
        try:
            self._end(wait=True)
        except Exception as exc:  # noqa: BLE001
            self._broken(exc)

    def abort(self) -> None:
        """Ended without the run's own end (lmprof failed): the series and the alerts so far stay on disk."""
        if self.state == WATCHING:
            with contextlib.suppress(Exception):
                self._end(wait=False)
        self._release()
        self.state = STOPPED

    def result(self) -> WatchResult | None:
        return WatchResult(self.section) if self.section is not None else None

    def _end(self, wait: bool) -> None:
        w, an = self.w, self.an
        assert w is not None and an is not None
        if self.capture is not None:
            self.capture.abort()
            self.notes.append(f"the capture in {WATCH_DIR}/{self.capture.folder.name} was interrupted by the run's "
                              "end: its folder holds no run (marked INCOMPLETE)")
            self.capture = None
        rec = w.close() if wait else w.abort()
        rows = w.take()
        if rows is not None:
            an.feed(rows)
            self._stream(StepSummary.from_row(rows), math.inf)  # the last step, however recent the last one sent
        an.finish()
        self.state = STOPPED
        self._release()
        self.section = self._section(rec)
        self._save(force=True)

    def _section(self, rec: Any = None) -> WatchSection:
        w, an = self.w, self.an
        assert w is not None and an is not None and self.requests is not None
        notes = [*an.notes, *self.notes, *self.requests.notes()]
        if self._aside:
            notes.append(f"{self._aside} step(s) ran under your own torch.profiler: left out of the series (a step "
                         "timed under a profiler is not clean)")
        notes.append("left out of the series: the first step after lmprof's profiler stopped (it pays for the "
                     "profiler's teardown)" + ("; the steps of each captured window and the step after it (they ran "
                                              "under lmprof's profiler)" if self.captures or self.capture else ""))
        notes += [f"{n} capture request(s) refused by {rule}" for rule, n in self._refused.items()]
        assert self.folder is not None
        return (rec or w.recorded()).section(self.folder, self.base, alerts=list(an.alerts),
                                            alerts_dropped=dict(an.dropped), captures=list(self.captures),
                                            notes=notes)

    def _save(self, changed_only: bool = False, force: bool = False) -> None:
        """``watch/watch.json`` now (``changed_only``: when an alert opened or closed since the last one)."""
        if self.folder is None or self.an is None or (self.state != WATCHING and not force):
            return
        state = (tuple((a.kind, a.first_step, a.ongoing) for a in self.an.alerts), len(self.captures),
                 self.capture is not None, len(self.notes))
        if changed_only and state == self._saved:
            return
        self._saved = state
        try:
            save_section(self.folder, self.section if force and self.section is not None else self._section())
        except OSError as exc:
            if not any(n.startswith("watch/watch.json") for n in self.notes):
                self.notes.append(f"watch/watch.json could not be written ({why(exc)})")

    def _release(self) -> None:
        """Remove what the watch placed (the forward hook, torch.save's patch, the SIGUSR2 handler, the sink)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._saves.remove()
        if self.requests is not None:
            self.requests.close()
        sink, self.spec.sink = self.spec.sink, None
        if sink is not None:
            with contextlib.suppress(Exception):
                sink.close()

    def _broken(self, exc: BaseException) -> None:
        """The watch failed: it stops, the run measured before it and the series so far are kept."""
        line = f"the watch stopped at step {self._next} ({why(exc)})"
        print(f"lmprof: {line}; your script continues", file=sys.stderr)
        if os.environ.get("LMPROF_DEBUG"):
            import traceback

            traceback.print_exc(file=sys.stderr)
        self.notes.append(line)
        if self.state == WATCHING and self.w is not None and self.an is not None:
            with contextlib.suppress(Exception):
                self._end(wait=False)
        self._release()
        self.state = STOPPED

    def _say(self, text: str) -> None:
        if self.panel is not None:  # verbose runs only (a rank of torchrun, verbose=False: the record says it)
            self.panel.say(text)


def _capacity(device: Any) -> float | None:
    """The device's memory (CUDA), or the machine's (CPU): what 'full in N steps' counts to."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return None


def watch_of(windows: Any) -> WatchWindow | None:
    """The watch among a session's windows, if it has one (the doors hand it the script's loss)."""
    return next((w for w in windows if isinstance(w, WatchWindow)), None)
