"""Energy and machine noise over exactly the clean window.

The meter (RAPL, NVML, Apple, or an estimate) and the machine's counters (load, context switches)
are read as the first clean step begins and as the last one ends. A meter that cannot start is a
missing figure (n/a, said in the record) for someone else's loop, an error for lmprof's own loop
when it was asked for (the driver decides). In lmprof's own loop the clean window grows to what the
meter needs for a reading (:meth:`EnergyMonitor.extra_steps`), sized from the warm-up steps' times.
"""
from __future__ import annotations


from lmprof.measure.energy import EnergyMonitor
from lmprof.measure.energy.monitor import EnergyResult
from lmprof.measure.noise import Snapshot, snapshot
from lmprof.pipeline.protocol.windows.base import Context, Window


class MeterWindow(Window):
    """:attr:`energy` and :attr:`noise` (counters before, after) once the clean window ended."""

    name = "meter"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.monitor: EnergyMonitor | None = None
        self.energy: EnergyResult | None = None
        self.noise: tuple[Snapshot, Snapshot] | None = None
        self._before: Snapshot | None = None
        self._metering = False  # the monitor's window is open

    @property
    def active(self) -> bool:
        return self._before is not None and self.noise is None

    def attached(self) -> None:
        seen = self.ctx.observed
        if self.monitor is None and seen.device is not None:
            self.monitor = self.ctx.driver.meter(seen.device, self.ctx.spec, seen.notes)

    def detached(self) -> None:
        self.abort()

    def step_begins(self, step: int) -> None:
        plan = self.ctx.plan
        if plan.warmup_ends(step) and self.ctx.driver.sizes_energy_window:
            self._size(plan.steps)
        if self.ctx.plan.clean_begins(step):
            self.start()

    def step_ends(self, step: int) -> None:
        if self.ctx.plan.clean_ends(step):
            self.stop()

    def _size(self, steps: int) -> None:
        """Lengthen the clean window to what the meter needs; the fastest warm-up step after the first
        sets it (a faster step needs more of them, so this errs long)."""
        warm = self.ctx.timings.warm()
        if self.monitor is not None and self.monitor.available and self.ctx.plan.steps and warm:
            self.ctx.lengthen(self.monitor.extra_steps(step_s=min(warm), steps=steps))

    def start(self) -> None:
        self._before = snapshot()
        if self.monitor is not None:
            self.monitor.begin()
            self._metering = True

    def stop(self) -> None:
        if self._before is not None:
            self.noise = (self._before, snapshot())
        if self.monitor is not None and self._metering:
            monitor, self.monitor = self.monitor, None
            self.energy = monitor.end()
            monitor.close()

    def abort(self) -> None:
        """The clean window did not end: no energy figure from a part of it."""
        if self.monitor is not None:
            monitor, self.monitor = self.monitor, None
            monitor.close()
