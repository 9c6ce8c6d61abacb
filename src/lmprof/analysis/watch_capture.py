"""When the whole-run watch asks for a capture, and what a captured window shows against the baseline.

:class:`CaptureLimiter` decides whether a capture may begin: at most ``max_captures`` in a run, and an
alert's request at least ``min_gap_steps`` after the last capture began (a request from outside the
script, SIGUSR2 or the ``capture`` file, is the user's own and skips the gap, never the maximum).

:func:`capture_diff` names the blocks and operators that grew from the baseline window (the run's own
profiled steps) to a captured window. Both are profiled the same way, so their ``profiled_ms`` (blocks)
and self times (operators; device times where both windows have them) are compared as measured, with
no scaling to a clean step. Names are matched with ``lmprof compare``'s rule (:func:`~lmprof.analysis.
compare.count_rows`: appeared, changed, per name). A growth is beyond noise when it exceeds SLOW_SPREADS x
the larger of the block's own spread in either window and the baseline profiled steps' relative spread
applied to its baseline time (analysis/noise.py's "twice its own spread").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from lmprof.analysis.compare import count_rows
from lmprof.analysis.noise import SLOW_SPREADS
from lmprof.counts import WATCH_LIMITS
from lmprof.record.run import Block, Growth, OpStat, RequestKind, Run, WatchAlert, percentile

# Alerts that ask for a capture by default: what a profile of the next steps can explain, because it is
# still going on. A spike is reported once ``window`` steps have passed without a drift around it (the
# first steps of a lasting slowdown look like one until the rolling median catches up), so the steps a
# capture would profile are ordinary ones again, and a capture spent on them would count against the
# maximum that a drift needs; a straggler is found across ranks after the run.
CAPTURE_KINDS = frozenset({"drift", "memory_creep", "input_bound"})


@dataclass
class CaptureLimiter:
    """A minimum gap between captures asked by alerts, and a maximum count for the run."""

    min_gap_steps: int = WATCH_LIMITS.min_gap_steps
    max_captures: int = WATCH_LIMITS.max_captures
    kinds: frozenset[str] = CAPTURE_KINDS
    began: list[int] = field(default_factory=list)  # the steps captures began at

    def __post_init__(self) -> None:
        if self.min_gap_steps < 0 or self.max_captures < 0:
            raise ValueError("min_gap_steps and max_captures must be >= 0")

    def refuse(self, step: int, requested_by: RequestKind, alert: WatchAlert | None = None) -> str | None:
        """None when a capture may begin at ``step``; else why not, in one line."""
        if len(self.began) >= self.max_captures:
            return f"no capture: the run has had its {self.max_captures} (the maximum)"
        if requested_by == "alert":
            if alert is None or alert.kind not in self.kinds:
                return f"no capture: {alert.kind if alert else 'this'} alerts ask for none"
            if self.began and step - self.began[-1] < self.min_gap_steps:
                return (f"no capture: {step - self.began[-1]} step(s) since the last one began, fewer than the "
                        f"minimum gap of {self.min_gap_steps}")
        return None

    def begin(self, step: int) -> None:
        """A capture begins at ``step``."""
        self.began.append(step)


@dataclass(frozen=True)
class _Row:
    value: float
    spread: float | None


def _blocks(blocks: Sequence[Block]) -> dict[str, _Row]:
    out: dict[str, _Row] = {}
    for b in blocks:
        key = f"{b.name} ({b.phase})"
        spread = None
        if b.spread_ms is not None and b.time_ms > 0:
            spread = b.spread_ms * b.profiled_ms / b.time_ms  # spread_ms is on the time_ms scale
        prev = out.get(key)
        spreads = [x for x in (spread, prev.spread if prev else None) if x is not None]
        out[key] = _Row(b.profiled_ms + (prev.value if prev else 0.0), max(spreads) if spreads else None)
    return out


def _ops(ops: Sequence[OpStat], device: bool) -> dict[str, _Row]:
    out: dict[str, _Row] = {}
    for o in ops:
        key = f"{o.name} ({o.phase})"
        value = (o.device_ms or 0.0) if device else o.self_ms
        out[key] = _Row(value + (out[key].value if key in out else 0.0), None)
    return out


def _grew(kind: Literal["block", "operator"], before: dict[str, _Row], after: dict[str, _Row], rel_spread: float,
          top: int) -> list[Growth]:
    rows = count_rows([{k: r.value for k, r in before.items()}, {k: r.value for k, r in after.items()}])
    out = []
    for r in rows:
        b_ms, a_ms = r.counts
        delta = a_ms - b_ms
        if r.change not in ("appeared", "changed") or delta <= 0:
            continue
        name, _, phase = r.name.rpartition(" (")
        spreads = [x.spread for x in (before.get(r.name), after.get(r.name)) if x is not None and x.spread is not None]
        noise = SLOW_SPREADS * max([*spreads, rel_spread * b_ms])
        out.append(Growth(kind=kind, name=name, phase=phase[:-1], before_ms=b_ms, after_ms=a_ms,
                          delta_ms=delta, ratio=a_ms / b_ms if b_ms > 0 else None,
                          status="new" if r.change == "appeared" else "grew", noise_ms=noise,
                          beyond_noise=delta > noise))
    out.sort(key=lambda g: (not g.beyond_noise, -g.delta_ms))
    return out[:top]


def capture_diff(before_blocks: Sequence[Block], before_ops: Sequence[OpStat], after_blocks: Sequence[Block],
                 after_ops: Sequence[OpStat], *, rel_spread: float = 0.0, top: int = 10) -> list[Growth]:
    """The blocks, then the operators, that took longer per profiled step after than before, those beyond
    noise first, each kind largest growth first (at most ``top`` of each). ``rel_spread``: the baseline
    profiled steps' (p90 - p10) / median."""
    device = any(o.device_ms for o in before_ops) and any(o.device_ms for o in after_ops)
    return (_grew("block", _blocks(before_blocks), _blocks(after_blocks), rel_spread, top)
            + _grew("operator", _ops(before_ops, device), _ops(after_ops, device), rel_spread, top))


def profiled_spread(run: Run) -> float:
    """(p90 - p10) / median of a run's profiled steps (run.tables["attribution"]), 0 when unknown."""
    rows = run.tables.get("attribution") or []
    steps = [float(x) for x in (rows[0].get("profiled_step_ms") or [])] if rows else []
    if len(steps) < 2:
        return 0.0
    med = percentile(steps, 50)
    return (percentile(steps, 90) - percentile(steps, 10)) / med if med > 0 else 0.0


def diff_runs(baseline: Run, capture: Run, top: int = 10) -> list[Growth]:
    """:func:`capture_diff` of two run records (the run itself and a capture's child run), with the larger
    relative spread of their profiled steps as the noise."""
    return capture_diff(baseline.blocks, baseline.ops, capture.blocks, capture.ops,
                        rel_spread=max(profiled_spread(baseline), profiled_spread(capture)), top=top)
