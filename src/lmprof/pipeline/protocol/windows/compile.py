"""The compile watch: what torch.compile compiled, recompiled and broke, by phase, for a compiled model.

Open from the moment the session learns its model is compiled to the run's end: dynamo's records
made since the session began are the run's (``lmprof run`` learns it at the first optimizer step,
after that step compiled), counted by phase (warm-up, measured, profiled); the compiled graphs'
kernels are recorded with their blocks (measure/compiled_kernels.py). Its report goes into the run
(:meth:`CompileWindow.report`); a run that records nothing closes it unread.
"""
from __future__ import annotations

from typing import Any

from lmprof.measure.compile_events import MEASURED, CompileReport, CompileWatch
from lmprof.measure.compile_events import baseline as compile_baseline
from lmprof.pipeline.protocol.windows.base import Context, Window


class CompileWindow(Window):
    """A :class:`CompileWatch` moved from phase to phase as the plan says."""

    name = "compile"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.watch: CompileWatch | None = None
        self._before = compile_baseline()  # what was compiled before this session began

    @property
    def active(self) -> bool:
        return self.watch is not None

    def attached(self) -> None:
        if self.ctx.observed.compiled and self.watch is None:
            try:  # compilations, recompilations and graph breaks of the compiled model, per phase
                self.start()
            except Exception as exc:  # noqa: BLE001 - a missing compile report is a missing figure
                self.ctx.driver.missing_figure(exc, self.ctx.observed.notes,
                                               "torch.compile: its compilations could not be watched")

    def start(self) -> None:
        self.watch = CompileWatch.start(since=self._before)

    def step_begins(self, step: int) -> None:
        if self.watch is not None and self.ctx.plan.warmup_ends(step):
            self.watch.first_call_s = self.ctx.timings.first()
            self.watch.phase(MEASURED)

    def detached(self) -> None:
        self.abort()

    def step_ends(self, step: int) -> None:
        if self.watch is not None and self.ctx.plan.clean_ends(step):
            self.watch.count(MEASURED, self.ctx.timings.clean)
            self.watch.phase("profiled")

    def kernel_graphs(self) -> list[dict[str, Any]]:
        """The compiled graphs' kernels so far (attribution names compiled kernels by them)."""
        return self.watch.kernel_graphs() if self.watch is not None else []

    def report(self) -> CompileReport | None:
        """Close the watch: the run's compile report (None when the model is not compiled)."""
        watch, self.watch = self.watch, None
        return watch.finish() if watch is not None else None

    def stop(self) -> None:
        self.report()

    def abort(self) -> None:
        """Close a watch no record will report (its kernel recorder stays on otherwise)."""
        self.report()
