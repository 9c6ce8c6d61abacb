"""One window the whole-run watch profiles by itself (windows/watch.py), with the profiled window's own
machinery: torch.profiler over one warm-up step and the profiled steps (measure/window.py), the probes
that scope someone else's step (probes.py), and a give-way to the user's own profiler.

It starts at a step boundary, inside the user's call (the profiler's start), is stepped at each later
boundary, and when its last step ends the profiler stops and the window is written as a run folder of
its own (finish/capture.py, through the session: a window reaches it only through its Context). The
folder holds ``INCOMPLETE`` until its run.json is written, as any run folder that is being measured
into (folder.py).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Sequence

from lmprof.atomic import write_text
from lmprof.measure.window import GiveWay, ProfilerWindow
from lmprof.pipeline.protocol.folder import INCOMPLETE
from lmprof.pipeline.protocol.guard import why
from lmprof.pipeline.protocol.probes import Probes
from lmprof.pipeline.protocol.windows.base import Context, beside_of
from lmprof.record.run import RequestKind, WatchCapture

MARK = "this captured window was interrupted before its record (run.json) was written\n"


class Capture:
    """A captured window: ``first_step`` is its first profiled step (the step before it is the profiler's
    warm-up), ``steps`` profiled steps, into ``folder`` (a child of the run folder)."""

    def __init__(self, ctx: Context, folder: Path, run_folder: Path, first_step: int, steps: int,
                 requested_by: RequestKind, alert: int | None):
        self.ctx, self.folder, self.run_folder = ctx, folder, run_folder
        self.first_step, self.steps = first_step, steps
        self.requested_by, self.alert = requested_by, alert
        self.window: ProfilerWindow | None = None
        self._probes: Probes | None = None
        self._give_way: GiveWay | None = None
        self._warm = True  # the running step is the profiler's warm-up step
        self.dropped: str | None = None  # why the capture was dropped (the user's own profiler started)
        self._seen = (0, 0, 0, 0)  # backward and forward passes, batches and token ids the probes counted

    def start(self) -> None:
        """Claim the folder, scope the step, start the profiler (the next step is its warm-up)."""
        seen = self.ctx.observed
        assert seen.device is not None
        self.folder.mkdir(parents=True)  # a new folder: never into an earlier capture's
        write_text(self.folder / INCOMPLETE, MARK)
        self._probes = Probes(seen.model, self.ctx.spec.mode, blocks=not seen.compiled,
                              phases=self.ctx.driver.probes_place_phases,
                              beside=beside_of(self.ctx))
        self._probes.install(seen.optimizers)
        self.window = ProfilerWindow(seen.device.torch_device, self.folder / "trace.json.gz")
        self.ctx.kineto_ran = True
        self.window.start()
        self._give_way = GiveWay(self._user_profiler_starts)
        self._give_way.install()

    def probes(self) -> Probes | None:
        return self._probes

    def boundary(self) -> bool:
        """A step ended: the next profiled step's range opens; True when the last one ended (the profiler
        is then stopped, the trace not yet written)."""
        window, probes = self.window, self._probes
        if window is None or probes is None:
            return False
        self.ctx.observed.sync()  # the step's device work inside its range, as the profiled window's steps
        probes.step_end()
        if self._warm:
            self._warm = False
            probes.forwards = probes.backwards = probes.batches = probes.tokens = 0  # from the first profiled step
        else:
            window.close_step()
        if window.complete >= self.steps:
            window.stop()
            self._release()
            return True
        window.open_step()
        return False

    def finish(self, step_s: Sequence[float]) -> WatchCapture:
        """Write the stopped window as a run folder of its own; the record run.json's ``watch.captures`` lists."""
        window = self.window
        assert window is not None and not window.running
        per = max(window.complete, 1)
        per_step = tuple(n / per if n else None for n in self._seen)
        profile = window.export()
        config = {"source": "lmprof watch capture",
                  "capture": {"first_step": self.first_step, "steps": self.steps, "requested_by": self.requested_by}}
        self.ctx.assemble_capture(self.folder, profile, list(step_s), config,
                                  per_step)  # type: ignore[arg-type]  # four counts
        with contextlib.suppress(OSError):
            os.unlink(self.folder / INCOMPLETE)
        self.window = None
        return WatchCapture(path=self.folder.relative_to(self.run_folder).as_posix(), first_step=self.first_step,
                            steps=window.complete, requested_by=self.requested_by, alert=self.alert)

    def abort(self) -> None:
        """Stop whatever runs and keep nothing (the folder keeps its INCOMPLETE mark)."""
        if self.window is not None:
            self.window.abort()
            self.window = None
        self._release()

    def _release(self) -> None:
        if self._give_way is not None:
            self._give_way.remove()
            self._give_way = None
        probes, self._probes = self._probes, None
        if probes is not None:
            self._seen = (probes.backwards, probes.forwards, probes.batches, probes.tokens)
            probes.remove()

    def _user_profiler_starts(self) -> None:
        """The user's own torch.profiler is starting while this capture runs: lmprof's stops first (two
        cannot run at once), unwritten; the watch says so at the next boundary. Runs inside the user's
        call: nothing it raises may reach it."""
        try:
            self.abort()
        except Exception as exc:  # noqa: BLE001 - inside the user's profiler start
            self.dropped = f"your own torch.profiler started during it; stopping lmprof's failed ({why(exc)})"
            return
        self.dropped = "your own torch.profiler started during it (two profilers cannot run at once)"
