"""Streaming the whole-run watch to a tracker: one step's summary as scalars named by the trackers' rule.

``step_scalars(summary)`` gives ``watch/step_time_ms``, ``watch/device_time_ms``, ``watch/tokens_per_s``,
``watch/loss``, ``watch/input_wait_ms``, ``watch/memory.allocated_B``, ``watch/memory.reserved_B`` and
``watch/rss_B`` (:func:`~lmprof.trackers.content.metric_name`: the unit in the name), those the step has;
the caller logs them at ``summary.step`` with its tracker (the protocol does, under ``--log-to``).
"""
from __future__ import annotations

from lmprof.record.watch import StepSummary
from lmprof.trackers.content import metric_name

# summary field -> (figure name, unit, factor from the summary's unit)
_FIGURES = {
    "step_s": ("watch/step_time", "ms", 1e3),
    "device_s": ("watch/device_time", "ms", 1e3),
    "tokens_per_s": ("watch/tokens_per_s", "tokens/s", 1.0),
    "loss": ("watch/loss", "", 1.0),  # the script's own loss, in whatever unit it has
    "input_wait_s": ("watch/input_wait", "ms", 1e3),
    "mem_allocated_B": ("watch/memory.allocated", "B", 1.0),
    "mem_reserved_B": ("watch/memory.reserved", "B", 1.0),
    "rss_B": ("watch/rss", "B", 1.0),
}


def step_scalars(summary: StepSummary) -> dict[str, float]:
    """The step's figures as tracker scalars (n/a figures left out)."""
    out = {}
    for field, value in summary.items():
        spec = _FIGURES.get(field)
        if spec is not None and value is not None:
            name, unit, factor = spec
            out[metric_name(name, unit)] = float(value) * factor
    return out
