"""The one interface every energy meter implements, and the small value types it returns.

A meter reads one *domain* (one GPU board, one CPU package, the DRAM of one package, one SoC): it
is probed once, then reads windows with ``begin()`` / ``end()``. Meters never decide policy (idle
baseline, which meters to use, warnings); :mod:`lmprof.measure.energy.monitor` does that.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Literal

Clock = Callable[[], float]
Source = Literal["measured", "estimated"]


class MeterError(RuntimeError):
    """A meter that probed fine failed while reading; the monitor turns it into an n/a reading."""


@dataclass(frozen=True)
class Span:
    """A window's start and end on a meter's clock, in seconds."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class WindowClock:
    """The clock of a ``begin()``..``end()`` window: started by begin, read and cleared once by end, so an
    end without a begin is an error (``what`` names the window in it) rather than a window from an old start."""

    def __init__(self, clock: Clock, what: str) -> None:
        self._clock = clock
        self._what = what
        self._start: float | None = None

    @property
    def running(self) -> bool:
        return self._start is not None

    def start(self) -> None:
        self._start = self._clock()

    def stop(self) -> Span:
        if self._start is None:
            raise MeterError(f"{self._what}.end() without begin()")
        span = Span(self._start, self._clock())
        self._start = None
        return span


@dataclass(frozen=True)
class Availability:
    """Whether a meter can read here; ``reason`` says why not (or, when ok, how it will read)."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class EnergyWindow:
    """Energy of one domain over one ``begin()``..``end()`` window."""

    joules: float
    seconds: float
    method: str  # how it was read: "counter", "power-polling", "model"
    samples: int | None = None  # power samples integrated, for polling meters
    note: str | None = None

    @property
    def watts(self) -> float | None:
        """Average power over the window (None for a zero-length window)."""
        return self.joules / self.seconds if self.seconds > 0 else None


class EnergyMeter(ABC):
    """One energy counter or power sensor for one domain.

    Subclasses set ``name`` (the meter: "nvml", "rapl", ...), ``domain`` ("gpu:0",
    "cpu-package-0", "dram-0", "soc-0"), ``update_period_s`` (how often the underlying value
    changes: a window shorter than this can read as zero or one quantum) and ``min_window_s`` (the
    window below which the quantisation error can exceed about 10 %).
    """

    name: str = "meter"
    domain: str = "unknown"
    source: Source = "measured"
    # Sub-domains (e.g. RAPL "core", which sits inside the package) would double count in a total.
    in_total: bool = True

    @property
    def update_period_s(self) -> float:
        """How often the underlying value changes (s); a subclass overrides it (a class attribute will do)."""
        return 0.0

    @property
    def min_window_s(self) -> float:
        """Shortest window this meter reads to within ~10 %: ten of its update periods."""
        return 10.0 * self.update_period_s

    @property
    def method(self) -> str:
        """How this meter reads ("counter", "power-polling", "model"); valid after ``probe()``."""
        return "counter"

    @abstractmethod
    def probe(self) -> Availability:
        """Check, without side effects beyond opening the interface, whether this meter can read."""

    @abstractmethod
    def begin(self) -> None:
        """Start a window: read the counter (or start sampling) now."""

    @abstractmethod
    def end(self) -> EnergyWindow:
        """Finish the window started by :meth:`begin` and return its energy."""

    def modelled_idle_w(self) -> float | None:
        """Idle power from a model, for meters that need no idle measurement (estimates only)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: most meters hold nothing to release
        """Release what :meth:`probe` opened (library handles, threads). Safe to call twice."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(domain={self.domain!r})"


class UnavailableMeter(EnergyMeter):
    """Stands in for a meter that cannot exist here (no interface at all), carrying the reason."""

    def __init__(self, name: str, domain: str, reason: str) -> None:
        self.name = name
        self.domain = domain
        self._reason = reason

    def probe(self) -> Availability:
        return Availability(False, self._reason)

    def begin(self) -> None:
        raise MeterError(self._reason)

    def end(self) -> EnergyWindow:
        raise MeterError(self._reason)
