"""Pick the energy meters for a device, measure an idle baseline, and read windows aligned with steps.

Usage (the runner owns the steps; the monitor only reads counters around them)::

    mon = EnergyMonitor.for_device(device, mode="auto")   # probes; never raises for missing meters
    mon.measure_idle()                                     # before warm-up, while the device idles
    ...warm-up...
    steps += mon.extra_steps(step_s=median_step_s, steps=steps)   # reach the shortest good window
    mon.begin()                                            # right before the first measured step
    ...measured steps (device synchronized after the last)...
    result = mon.end()                                     # right after the last measured step
    mon.close()

Modes: ``auto`` uses every real meter the device has (CUDA: NVML for that GPU plus RAPL for the
host CPU; CPU: RAPL; MPS: powermetrics); ``estimate`` uses only a stated-TDP model, labelled
estimated; ``off`` reads nothing. Missing meters become n/a readings with a reason, never errors.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from lmprof.errors import ConfigError
from lmprof.measure.energy.apple import PowermetricsMeter
from lmprof.measure.energy.base import Availability, Clock, EnergyMeter, EnergyWindow, Source, WindowClock
from lmprof.measure.energy.estimate import DEFAULT_IDLE_FRACTION, EstimateMeter
from lmprof.measure.energy.nvml import NvmlMeter
from lmprof.measure.energy.rapl import POWERCAP_ROOT, Reader, rapl_meters, read_text

log = logging.getLogger("lmprof.energy")
# A library must not print through logging's last-resort handler; the warnings travel in the result.
log.addHandler(logging.NullHandler())

Mode = Literal["auto", "off", "estimate"]
MODES: tuple[str, ...] = ("auto", "off", "estimate")
DEFAULT_IDLE_S = 1.0


@dataclass
class DomainEnergy:
    """One domain, its meter and idle baseline, and the meter's reading of the measured window
    (``window``; None means n/a, see ``reason``). The reading is kept whole rather than copied out
    field by field: its joules, seconds and samples are read through it."""

    domain: str
    meter: str
    method: str
    source: Source
    in_total: bool
    update_period_s: float
    window: EnergyWindow | None = None
    idle_w: float | None = None
    reason: str | None = None
    note: str | None = None

    @property
    def joules(self) -> float | None:
        return None if self.window is None else self.window.joules

    @property
    def seconds(self) -> float | None:
        return None if self.window is None else self.window.seconds

    @property
    def samples(self) -> int | None:
        return None if self.window is None else self.window.samples

    @property
    def available(self) -> bool:
        return self.joules is not None

    @property
    def watts(self) -> float | None:
        if self.joules is None or not self.seconds:
            return None
        return self.joules / self.seconds

    def label(self) -> str:
        """e.g. ``gpu:0 (nvml counter)``."""
        return f"{self.domain} ({self.meter} {self.method})"


@dataclass
class EnergyResult:
    """Everything one window measured, per domain, plus warnings; see :func:`energy_metrics`."""

    mode: str
    seconds: float | None = None
    domains: list[DomainEnergy] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    idle_seconds: float | None = None

    @property
    def counted(self) -> list[DomainEnergy]:
        """Domains with a reading that add up into the total."""
        return [d for d in self.domains if d.available and d.in_total]

    @property
    def missing(self) -> list[DomainEnergy]:
        return [d for d in self.domains if not d.available]

    @property
    def available(self) -> bool:
        return bool(self.counted)

    @property
    def source(self) -> Source | None:
        """``measured`` or ``estimated``; the monitor never mixes the two in one result."""
        sources = {d.source for d in self.counted}
        return sources.pop() if len(sources) == 1 else None

    @property
    def total_joules(self) -> float | None:
        readings = [d.joules for d in self.counted if d.joules is not None]  # counted: every one has a reading
        return sum(readings) if readings else None

    @property
    def average_watts(self) -> float | None:
        total = self.total_joules
        if total is None or not self.seconds:
            return None
        return total / self.seconds

    @property
    def idle_watts(self) -> float | None:
        """Summed idle power of the counted domains, if every one of them has a baseline."""
        counted = self.counted
        baselines = [d.idle_w for d in counted if d.idle_w is not None]
        if not counted or len(baselines) < len(counted):
            return None
        return sum(baselines)

    @property
    def above_idle_joules(self) -> float | None:
        """Total minus what the same domains draw idle over the same time (may be < 0 if noisy)."""
        total, idle = self.total_joules, self.idle_watts
        if total is None or idle is None or self.seconds is None:
            return None
        return total - idle * self.seconds

    def coverage(self) -> str:
        """Which domains the total covers, e.g. ``gpu:0 (nvml counter) + cpu-package-0 (rapl counter)``."""
        return " + ".join(d.label() for d in self.counted)

    def unavailable_reasons(self) -> str:
        """``domain[, domain]: reason`` for each distinct reason, joined with ``; ``."""
        by_reason: dict[str, list[str]] = {}
        for d in self.missing:
            by_reason.setdefault(d.reason or "not available", []).append(d.domain)
        return "; ".join(f"{', '.join(doms)}: {reason}" for reason, doms in by_reason.items())

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per domain, e.g. for ``Run.tables["energy"]``."""
        return [
            {
                "domain": d.domain, "meter": d.meter, "method": d.method, "source": d.source,
                "in_total": d.in_total, "joules": d.joules, "seconds": d.seconds, "watts": d.watts,
                "idle_w": d.idle_w, "samples": d.samples, "reason": d.reason, "note": d.note,
            }
            for d in self.domains
        ]

    def explanation(self) -> str:
        """One line for the terminal summary, e.g. ``energy: n/a — cpu: no RAPL powercap ...``."""
        if self.mode == "off":
            return "energy: off"
        missing = self.unavailable_reasons()
        if not self.available:
            if not self.domains:
                return "energy: n/a — no energy meter for this device"
            # One domain: its reason alone reads best; several: name each.
            if len(self.missing) == 1:
                return f"energy: n/a — {self.missing[0].reason}"
            return f"energy: n/a — {missing}"
        head = "energy (estimated, not measured)" if self.source == "estimated" else "energy"
        parts = [f"{head}: {self.total_joules:.4g} J over {self.seconds:.3g} s"]
        if self.average_watts is not None:
            parts[0] += f" ({self.average_watts:.4g} W avg"
            if self.idle_watts is not None:
                parts[0] += f", idle {self.idle_watts:.4g} W"
            parts[0] += ")"
        parts.append(self.coverage())
        line = " — ".join(parts)
        if missing:
            line += f"; n/a: {missing}"
        return line


def steps_for_window(step_s: float, min_window_s: float, steps: int = 0) -> int:
    """How many steps to add to ``steps`` so that ``steps x step_s`` reaches ``min_window_s``."""
    if step_s <= 0 or min_window_s <= 0:
        return 0
    return max(0, math.ceil(min_window_s / step_s - 1e-9) - steps)


def _probe(meter: EnergyMeter) -> Availability:
    # A meter's probe must not take the run down, whatever the driver does.
    try:
        return meter.probe()
    except Exception as exc:  # noqa: BLE001
        return Availability(False, f"{meter.name} probe failed: {exc}")


class EnergyMonitor:
    """Reads a set of meters together: idle baseline once, then any number of windows.

    ``clock`` and ``sleep`` are injectable for tests; meters bring their own boundaries.
    """

    def __init__(
        self,
        meters: Sequence[EnergyMeter],
        *,
        mode: Mode = "auto",
        idle_s: float = DEFAULT_IDLE_S,
        min_window_s: float | None = None,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown energy mode {mode!r}: use {', '.join(MODES)}")
        sources = {m.source for m in meters}
        if len(sources) > 1:
            raise ConfigError("measured and estimated energy meters cannot be combined in one monitor")
        self.mode = mode
        self.idle_s = idle_s
        self._min_window_override = min_window_s
        self._sleep = sleep
        self._meters: list[tuple[EnergyMeter, Availability]] = [(m, _probe(m)) for m in meters]
        self._idle: dict[int, tuple[float | None, str | None]] = {}  # id(meter) -> (watts, note)
        self._idle_seconds: float | None = None
        self._window = WindowClock(clock, "EnergyMonitor")
        self._begun: dict[int, str | None] = {}  # id(meter) -> None if begun, else the error

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def for_device(
        cls,
        device: Any,
        mode: Mode = "auto",
        *,
        idle_s: float = DEFAULT_IDLE_S,
        min_window_s: float | None = None,
        tdp_w: float | None = None,
        utilisation: float = 1.0,
        idle_fraction: float = DEFAULT_IDLE_FRACTION,
        nvml: Any = None,
        powercap_root: Path = POWERCAP_ROOT,
        read: Reader = read_text,
        apple: Callable[[], EnergyMeter] = PowermetricsMeter,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> "EnergyMonitor":
        """The meters that fit ``device`` (a :class:`~lmprof.hardware.devices.Device`, torch.device or str).

        ``estimate`` needs ``tdp_w`` (the device's rated power, watts). ``nvml``, ``powercap_root``,
        ``read`` and ``apple`` replace the hardware boundaries in tests.
        """
        if mode not in MODES:
            raise ConfigError(f"unknown energy mode {mode!r}: use {', '.join(MODES)}")
        kind, index = _kind_and_index(device)
        meters: list[EnergyMeter] = []
        if mode == "estimate":
            if tdp_w is None:
                raise ConfigError("energy='estimate' needs the device's rated power: pass tdp_w (watts)")
            meters = [
                EstimateMeter(
                    domain=_domain(kind, index), tdp_w=tdp_w, utilisation=utilisation,
                    idle_fraction=idle_fraction, clock=clock,
                )
            ]
        elif mode == "auto":
            if kind == "cuda":
                meters.append(NvmlMeter(index, uuid=_cuda_uuid(index), nvml=nvml, clock=clock))
                meters.extend(rapl_meters(powercap_root, read=read, clock=clock))
            elif kind == "mps":
                meters.append(apple())
            else:
                meters.extend(rapl_meters(powercap_root, read=read, clock=clock))
        return cls(meters, mode=mode, idle_s=idle_s, min_window_s=min_window_s, clock=clock, sleep=sleep)

    # -- what is there ------------------------------------------------------------------------
    @property
    def meters(self) -> list[tuple[EnergyMeter, Availability]]:
        """Every meter with its probe result."""
        return list(self._meters)

    def _ready(self) -> list[EnergyMeter]:
        return [m for m, a in self._meters if a.ok]

    @property
    def available(self) -> bool:
        """True if at least one meter can read here."""
        return bool(self._ready())

    @property
    def min_window_s(self) -> float:
        """Shortest window the available meters read to ~10 % (or the caller's override)."""
        if self._min_window_override is not None:
            return self._min_window_override
        return max((m.min_window_s for m in self._ready()), default=0.0)

    def extra_steps(self, step_s: float, steps: int) -> int:
        """Steps to add to ``steps`` (each ``step_s`` seconds) for the window to reach :attr:`min_window_s`."""
        if not self.available:
            return 0
        return steps_for_window(step_s, self.min_window_s, steps)

    def describe(self) -> str:
        """One line naming the meters that will read and those that cannot (before any window)."""
        if self.mode == "off":
            return "energy: off"
        return self._empty_result().explanation() if not self.available else (
            "energy meters: " + ", ".join(f"{m.domain} ({m.name} {m.method})" for m in self._ready())
            + "".join(f"; {m.domain}: n/a — {a.reason}" for m, a in self._meters if not a.ok)
        )

    # -- idle baseline ------------------------------------------------------------------------
    def measure_idle(self, seconds: float | None = None) -> None:
        """Read every meter over ``seconds`` (default ``idle_s``) of doing nothing.

        Call it before warm-up: right after work, GPUs stay clocked up for a while and would
        inflate the baseline. Model meters need no waiting; with no real meter nothing sleeps.
        """
        seconds = self.idle_s if seconds is None else seconds
        self._idle = {}
        measured = []
        for m in self._ready():
            modelled = m.modelled_idle_w()
            if modelled is not None:
                self._idle[id(m)] = (modelled, None)
            else:
                measured.append(m)
        if not measured or seconds <= 0:
            # Nothing to wait for: model-only baselines, or the caller turned the baseline off.
            self._idle_seconds = None
            return
        started = []
        for m in measured:
            try:
                m.begin()
                started.append(m)
            except Exception as exc:  # noqa: BLE001
                self._idle[id(m)] = (None, f"idle baseline failed: {exc}")
        self._sleep(seconds)
        for m in started:
            try:
                win = m.end()
                self._idle[id(m)] = (win.watts, None)
                if win.seconds < m.update_period_s:
                    self._idle[id(m)] = (None, f"idle window {win.seconds:.3f} s shorter than the meter's update period")
            except Exception as exc:  # noqa: BLE001
                self._idle[id(m)] = (None, f"idle baseline failed: {exc}")
        self._idle_seconds = seconds

    # -- the measured window ------------------------------------------------------------------
    def begin(self) -> None:
        """Start the window; call right before the first measured step (device already synchronized)."""
        if self._window.running:
            raise RuntimeError("EnergyMonitor.begin() called twice without end()")
        self._begun = {}
        for m in self._ready():
            try:
                m.begin()
                self._begun[id(m)] = None
            except Exception as exc:  # noqa: BLE001
                self._begun[id(m)] = f"{m.name} failed to start: {exc}"
        self._window.start()

    def end(self) -> EnergyResult:
        """Finish the window (call right after the last measured step, after synchronizing) and return it."""
        seconds = self._window.stop().seconds
        if self.mode == "off":
            return EnergyResult(mode="off", seconds=seconds)
        result = EnergyResult(mode=self.mode, seconds=seconds, idle_seconds=self._idle_seconds)
        for m, avail in self._meters:
            d = self._blank(m, avail)
            if avail.ok:
                err = self._begun.get(id(m), "not started")
                if err is None:
                    try:
                        win = m.end()
                        self._fill(d, win)
                    except Exception as exc:  # noqa: BLE001
                        d.reason = f"{m.name} failed: {exc}"
                else:
                    d.reason = err
            result.domains.append(d)
            if d.available:
                result.warnings.extend(self._window_warnings(m, d.seconds or seconds))
        for w in result.warnings:
            log.warning(w)
        return result

    def _empty_result(self) -> EnergyResult:
        return EnergyResult(mode=self.mode, domains=[self._blank(m, a) for m, a in self._meters])

    def _blank(self, m: EnergyMeter, avail: Availability) -> DomainEnergy:
        # A model's idle power is known without measure_idle(); a real meter's only after it.
        idle_w, idle_note = self._idle.get(id(m), (m.modelled_idle_w() if avail.ok else None, None))
        return DomainEnergy(
            domain=m.domain, meter=m.name, method=m.method, source=m.source, in_total=m.in_total,
            update_period_s=m.update_period_s, idle_w=idle_w,
            reason=None if avail.ok else avail.reason, note=idle_note,
        )

    @staticmethod
    def _fill(d: DomainEnergy, win: EnergyWindow) -> None:
        d.window, d.method = win, win.method  # the method the reading itself was taken with
        d.note = "; ".join(n for n in (win.note, d.note) if n) or None

    def _window_warnings(self, m: EnergyMeter, seconds: float) -> list[str]:
        # Each meter is judged by its own resolution unless the caller set one window for all.
        want = self._min_window_override if self._min_window_override is not None else m.min_window_s
        if seconds < m.update_period_s:
            return [
                f"energy window {seconds:.3f} s is shorter than the {m.name} update period "
                f"(~{m.update_period_s * 1000:.0f} ms) of {m.domain}: its reading may be zero or one "
                f"counter step; measure at least {want:.3g} s (EnergyMonitor.extra_steps gives the step count)"
            ]
        if seconds < want:
            return [
                f"energy window {seconds:.3f} s is under the {want:.3g} s that {m.domain} ({m.name}) needs "
                f"for ~10 % accuracy; measure longer (EnergyMonitor.extra_steps gives the step count)"
            ]
        return []

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release every meter (NVML handles, polling threads)."""
        for m, _ in self._meters:
            try:
                m.close()
            except Exception:  # noqa: BLE001 - closing must never mask the run's own outcome
                pass

    def __enter__(self) -> "EnergyMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_monitor(device: Any, mode: Mode = "auto", **kwargs: Any) -> EnergyMonitor:
    """Shorthand for :meth:`EnergyMonitor.for_device`."""
    return EnergyMonitor.for_device(device, mode, **kwargs)


def _kind_and_index(device: Any) -> tuple[str, int]:
    tdev = getattr(device, "torch_device", device)
    kind = getattr(tdev, "type", None)
    index = getattr(tdev, "index", None)
    if kind is None:
        text = str(device).strip().lower()
        kind, _, idx = text.partition(":")
        index = int(idx) if idx.isdigit() else None
    if kind == "cuda" and index is None:
        index = _current_cuda_index()
    return str(kind), int(index or 0)


def _current_cuda_index() -> int:
    try:
        import torch

        return int(torch.cuda.current_device()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _cuda_uuid(index: int) -> str | None:
    """The board's UUID as torch sees it, so NVML opens the same GPU whatever CUDA_VISIBLE_DEVICES says."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        return str(uuid) if uuid else None
    except Exception:  # noqa: BLE001
        return None


def _domain(kind: str, index: int) -> str:
    return {"cuda": f"gpu:{index}", "mps": "soc-0"}.get(kind, "cpu")
