"""Power and energy measurement: GPU board (NVML), CPU package and DRAM (RAPL), Apple SoC
(powermetrics), or an explicitly requested estimate. See docs/energy.md.

The runners need only::

    from lmprof.measure.energy import EnergyMonitor, energy_metrics

Names are imported lazily so that ``python -m lmprof.measure.energy.nvml`` runs its module once
(an eager import here would load it as a dependency first and runpy would warn).
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Availability": "base",
    "EnergyMeter": "base",
    "EnergyWindow": "base",
    "MeterError": "base",
    "UnavailableMeter": "base",
    "energy_metrics": "metrics",
    "energy_summary_line": "metrics",
    "MODES": "monitor",
    "DomainEnergy": "monitor",
    "EnergyMonitor": "monitor",
    "EnergyResult": "monitor",
    "Mode": "monitor",
    "create_monitor": "monitor",
    "steps_for_window": "monitor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
