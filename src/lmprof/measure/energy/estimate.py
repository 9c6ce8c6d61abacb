"""An energy *estimate* from a stated power rating and a utilisation model (``energy="estimate"``).

Nothing is read from hardware. The model is deliberately simple and printed with every figure::

    idle power  = idle_fraction x TDP
    power       = idle power + utilisation x (TDP - idle power)
    energy      = power x window seconds

Used only when asked for; its figures are always labelled ``estimated`` and never added to measured
ones.
"""
from __future__ import annotations

import time

from lmprof.errors import ConfigError
from lmprof.measure.energy.base import Availability, Clock, EnergyMeter, EnergyWindow, WindowClock

DEFAULT_IDLE_FRACTION = 0.2  # datacentre GPUs idle near 10-20 % of TDP, desktop CPUs somewhat more


class EstimateMeter(EnergyMeter):
    """Modelled energy of one domain from ``tdp_w`` (watts) and ``utilisation`` (0..1)."""

    name = "estimate"
    source = "estimated"

    def __init__(
        self,
        *,
        domain: str,
        tdp_w: float,
        utilisation: float = 1.0,
        idle_fraction: float = DEFAULT_IDLE_FRACTION,
        clock: Clock = time.monotonic,
    ) -> None:
        if not tdp_w or tdp_w <= 0:
            raise ConfigError(f"energy='estimate' needs a positive TDP in watts (got {tdp_w!r})")
        if not 0.0 <= utilisation <= 1.0:
            raise ConfigError(f"utilisation must be within 0..1 (got {utilisation})")
        if not 0.0 <= idle_fraction <= 1.0:
            raise ConfigError(f"idle_fraction must be within 0..1 (got {idle_fraction})")
        self.domain = domain
        self.tdp_w = float(tdp_w)
        self.utilisation = float(utilisation)
        self.idle_fraction = float(idle_fraction)
        self._window = WindowClock(clock, "EstimateMeter")

    @property
    def method(self) -> str:
        return "model"

    @property
    def idle_w(self) -> float:
        return self.idle_fraction * self.tdp_w

    @property
    def watts(self) -> float:
        """Modelled power while the measured steps run."""
        return self.idle_w + self.utilisation * (self.tdp_w - self.idle_w)

    def describe(self) -> str:
        """The model and its inputs in one phrase, for notes."""
        return (
            f"estimate, not measured: TDP {self.tdp_w:g} W, idle {self.idle_fraction:.0%} of TDP, "
            f"utilisation {self.utilisation:.0%}"
        )

    def probe(self) -> Availability:
        return Availability(True, self.describe())

    def modelled_idle_w(self) -> float | None:
        return self.idle_w

    def begin(self) -> None:
        self._window.start()

    def end(self) -> EnergyWindow:
        seconds = self._window.stop().seconds
        return EnergyWindow(joules=self.watts * seconds, seconds=seconds, method="model", note=self.describe())
