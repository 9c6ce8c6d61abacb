"""Formatting figures for people: units kept, n/a spelled out, sizes in binary units."""
from __future__ import annotations

from lmprof.analysis.marks import first_call_note
from lmprof.modes import traits
from lmprof.record.catalogue import PARAMS, pick
from lmprof.record.run import Metric, Run
from lmprof.units import si


def human_bytes(n: float) -> str:
    """Bytes in B/KiB/MiB/GiB with three significant figures."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    x = float(n)
    for unit in units:
        if abs(x) < 1024 or unit == units[-1]:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.3g} {unit}"
        x /= 1024
    return f"{x:.3g} TiB"


def number(x: float, unit: str) -> str:
    """A value in its unit, scaled where the unit has natural multiples."""
    if unit == "B":
        return human_bytes(x)
    if unit in ("FLOP", "FLOP/s", "FLOP/J", "B/s", "J", "W") and abs(x) >= 1e3:
        return si(x, unit)
    if unit == "count":
        return f"{x:,.0f}"
    if unit == "tokens":
        return f"{x:,.0f} tokens"
    if abs(x) >= 1000:
        return f"{x:,.0f} {unit}"
    if abs(x) >= 100:
        return f"{x:.1f} {unit}"
    return f"{x:.3g} {unit}"


def metric_value(m: Metric) -> str:
    """'30.6 ms', or 'n/a' when the figure is unavailable."""
    if m.value is None:
        return "n/a"
    return number(m.value, m.unit)


def metric_spread(m: Metric) -> str:
    """'27.5 – 35.2 (n=10)' (p10 – p90) for repeated measurements, else ''."""
    if m.value is None or m.p10 is None or m.p90 is None:
        return ""
    lo, hi = number(m.p10, m.unit).rsplit(" ", 1)[0], number(m.p90, m.unit).rsplit(" ", 1)[0]
    return f"{lo} – {hi} (n={m.n})"


def run_title(run: Run, with_params: bool = True) -> str:
    """'lmprof train — GPT preset tiny (834,432 params) on cpu (AMD EPYC)'."""
    c = run.config
    model = c.get("hf") or c.get("model_name") or f"GPT preset {c.get('preset', '?')}"
    params = run.value(PARAMS) if with_params else None
    p = f" ({params:,.0f} params)" if params else ""
    return f"lmprof {run.mode} — {model}{p} on {run.env.device} ({run.env.device_name})"


def config_line(run: Run) -> str:
    """The run's shape and protocol in one line: batch, lengths, dtype, attention, compile, steps."""
    c = run.config
    parts = []
    for key, label in (("batch_size", "batch"), ("seq_len", "seq"), ("new_tokens", "new tokens")):
        if c.get(key):
            parts.append(f"{label} {c[key]}")
    for key in ("dtype", "attention", "optimizer"):
        if c.get(key):
            parts.append(str(c[key]))
    parts.append("compiled" if c.get("compile") else "eager")
    if first_call_note(run) is not None:
        # A script too short for the protocol: say what was timed, not the windows it never reached.
        timing = run.metrics[pick("timing", run.mode).name]
        parts.append(f"first call: {timing.n or 0} {traits(run.mode).unit}(s) timed roughly, no clean window")
    else:
        parts.append(f"{c.get('steps', '?')} timed steps after {c.get('warmup', '?')} warm-up, "
                     f"{c.get('profile_steps', '?')} profiled")
    return ", ".join(parts)
