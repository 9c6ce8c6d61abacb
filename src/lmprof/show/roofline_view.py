"""``lmprof roofline``'s output: a what-if answer as text lines and a plot, or as JSON.

Formats only: the figures come from :func:`lmprof.analysis.what_if.roofline_what_if`.
The JSON fields are documented in docs/flops-and-roofline.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from lmprof.analysis.what_if import RooflineAnswer
from lmprof.hardware.peaks import PeakTable
from lmprof.names import PASS_PHASES
from lmprof.show.roofline_plot import plot_roofline
from lmprof.units import si

_TABLE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def show_roofline(answer: RooflineAnswer, *, as_json: bool, out: Path | None, line: Callable[[str], None],
                  echo: Callable[[str], None]) -> None:
    """Print the answer: JSON through ``echo``, or text lines through ``line`` (and, for one batch
    with ``out`` given and the device's ceilings known, the roofline plot written to ``out``)."""
    if as_json:
        echo(_json(sweep_json(answer) if answer.sweep else roofline_json(answer)))
        return
    if answer.sweep:
        for text in sweep_lines(answer):
            line(text)
        return
    for text in roofline_lines(answer):
        line(text)
    if out is not None and answer.device.known:
        line(f"wrote {write_plot(answer, out)}")
    elif out is not None:
        line(f"no plot written to {out}: the device's ceilings are not known (see above)")


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _head(answer: RooflineAnswer) -> dict[str, Any]:
    return {"model": answer.model, "source": answer.source, "source_note": answer.source_note,
            "device": answer.device.name, "dtype": answer.dtype, "phase": answer.phase}


def _widths(answer: RooflineAnswer) -> dict[str, Any]:
    q = answer.query
    total, active = answer.params
    return {"weights": q.weights or answer.dtype, "kv_dtype": q.kv_dtype or answer.dtype,
            "params_total": total, "params_active": active}


def sweep_json(answer: RooflineAnswer) -> dict[str, Any]:
    """The sweep as a JSON-ready dict."""
    return {**_head(answer), "kv_length": answer.kv_len, **_widths(answer),
            "sweep": [{"batch": r.batch, "flops": r.flops, "bytes": r.bytes, "time_s": r.time_s,
                       "time_per_token_s": r.time_s / r.tokens, "tokens_per_s": r.tokens_per_s,
                       "bound": r.bound} for r in answer.sweep],
            "compute_bound_from_batch": answer.compute_bound_from_batch}


def roofline_json(answer: RooflineAnswer) -> dict[str, Any]:
    """One batch size's blocks and total as a JSON-ready dict."""
    result, dev = answer.result, answer.device
    assert result is not None, "roofline_json is for an answer at one batch size"
    return {**_head(answer), "batch": answer.query.batch_size, "seq_len": answer.seq_len, "kv_length": answer.kv_len,
            **_widths(answer), "peak_flops_per_s": dev.flops_per_s, "peak_bytes_per_s": dev.bytes_per_s,
            "conventions": answer.conventions.to_dict() if answer.source != "model" else
            {"describer": answer.conventions_lines()},
            "blocks": [{**c.to_dict(), "bound": p.bound, "time_s": p.min_time_s}
                       for c, p in zip(answer.costs, answer.points)],
            "total": {"flops": result.flops, "bytes": result.bytes, "time_s": result.time_s or None,
                      "tokens_per_s": result.tokens_per_s or None}}


def sweep_lines(answer: RooflineAnswer) -> list[str]:
    """The sweep as a table: one row per batch size, and where the phase turns compute-bound."""
    q, dt = answer.query, answer.dtype
    out = [f"lmprof roofline sweep: {answer.model}, {answer.phase} at KV length {answer.kv_len}, {dt} on "
           f"{answer.device.name}; weights {q.weights or dt}, KV {q.kv_dtype or dt}",
           f"source: {answer.source} ({answer.source_note})",
           f"{'batch':>7}{'FLOPs':>12}{'bytes':>12}{'time':>11}{'tokens/s':>14}  bound"]
    for r in answer.sweep:
        out.append(f"{r.batch:>7}{si(r.flops):>12}{si(r.bytes, 'B'):>12}{_time(r.time_s):>11}"
                   f"{r.tokens_per_s:>14,.0f}  {r.bound}")
    turn = answer.compute_bound_from_batch
    out.append(f"compute-bound from batch {turn}" if turn else
               "memory-bound at every batch swept: weights and KV reads dominate")
    return out


def roofline_lines(answer: RooflineAnswer) -> list[str]:
    """One batch size: the model and device, the conventions, a row per block and the total."""
    q, dev, dt, t, kv_len = answer.query, answer.device, answer.dtype, answer.seq_len, answer.kv_len
    result = answer.result
    assert result is not None, "roofline_lines is for an answer at one batch size"
    what = {"prefill": f"prefill of {t} tokens" + (f" (KV length {kv_len})" if kv_len != t else ""),
            "decode": f"one decode step at KV length {kv_len}",
            "train": f"training step (forward + backward) of {t} tokens"}[answer.phase]
    peak = dev.peak
    if dev.flops_per_s and dev.bytes_per_s:
        device_line = (f"device: {dev.name} ({dev.kind}): {si(dev.flops_per_s, 'FLOP/s')} {dt}, "
                       f"{si(dev.bytes_per_s, 'B/s')}; ridge {peak.ridge:.3g} FLOP/byte")
    else:
        # FLOPs, bytes and intensity need no peak: printed anyway, with why there is no bound or time.
        device_line = f"device: {dev.name} ({dev.kind}): no {dt} roofline ceilings, so no bound or time per block: {peak.note}"
    out = [f"lmprof roofline: {answer.model} ({answer.summary()}), {what}, "
           f"batch {q.batch_size}, {dt}" + (f", weights {q.weights}" if q.weights else "")
           + (f", KV {q.kv_dtype}" if q.kv_dtype else ""),
           f"source: {answer.source} ({answer.source_note})",
           device_line,
           f"peak source: {peak.source}" + (f"; bandwidth: {peak.bytes_source}" if peak.bytes_source else ""),
           "conventions:"]
    out += [f"  {text}" for text in answer.conventions_lines()]
    show_phase = len(PASS_PHASES[answer.phase]) > 1  # a training step: its forward and backward rows
    # the column as wide as the longest name: a model's own module names ("cpmant.position_bias") run long
    w = max([14] + [len(c.name) + 1 for c in answer.costs])
    head = f"{'block':<{w}}" + (f"{'phase':<10}" if show_phase else "") + (
        f"{'x':>4}{'FLOPs':>13}{'bytes':>12}{'FLOP/B':>10}  {'bound':<14}{'time':>11}{'share':>8}")
    out += [head, "-" * len(head)]
    total_time = result.time_s
    for c, p in zip(answer.costs, answer.points):
        share = 100.0 * (p.min_time_s or 0.0) / total_time if total_time else 0.0
        timing = f"{_time(p.min_time_s or 0.0):>11}{share:>7.1f}%" if total_time else f"{'-':>11}{'-':>8}"
        out.append(f"{c.name:<{w}}" + (f"{c.phase:<10}" if show_phase else "")
                   + f"{c.count:>4}{si(c.flops):>13}{si(c.bytes, 'B'):>12}{p.intensity:>10.3g}  {p.bound:<14}"
                   + timing)
    out.append("-" * len(head))
    if not total_time:
        out.append(f"total: {si(result.flops, 'FLOP')}, {si(result.bytes, 'B')}, "
                   f"{result.flops / result.bytes if result.bytes else 0:.3g} FLOP/byte; no roofline time without ceilings")
        return out
    out.append(f"total: {si(result.flops, 'FLOP')}, {si(result.bytes, 'B')}, roofline time {_time(total_time)} "
               f"(blocks run one after another, each at its roof) = {result.tokens / total_time:,.0f} tokens/s at best")
    return out


def write_plot(answer: RooflineAnswer, out: Path) -> Path:
    """The blocks on the device's roofline, as a PNG at ``out``."""
    dev = answer.device
    assert dev.flops_per_s and dev.bytes_per_s, "a roofline plot needs both ceilings"
    return plot_roofline(
        list(answer.points), peak_flops=dev.flops_per_s, peak_bytes_per_s=dev.bytes_per_s, out=out,
        device=dev.label, dtype=answer.dtype, model=f"{answer.model} B={answer.query.batch_size} T={answer.seq_len}",
        phase=answer.phase, measured=False, note=f"peak: {dev.peak.source}",
    )


def peak_table_lines(table: PeakTable) -> list[str]:
    """The peak table: dense TFLOP/s per dtype, GB/s and aliases per device."""
    out = [f"peak table version {table.version} ({', '.join(table.files)}); dense TFLOP/s, GB/s",
           f"{'device':<16}{'kind':<6}" + "".join(f"{c:>9}" for c in _TABLE_DTYPES) + f"{'GB/s':>9}  aliases"]
    for e in table.entries.values():
        cells = "".join(f"{e.flops[c] / 1e12:>9.4g}" if c in e.flops else f"{'-':>9}" for c in _TABLE_DTYPES)
        bw = f"{e.bytes_per_s / 1e9:>9.4g}" if e.bytes_per_s else f"{'-':>9}"
        out.append(f"{e.key:<16}{e.kind:<6}{cells}{bw}  {', '.join(e.aliases)}")
    return out


def _json(data: dict[str, Any]) -> str:
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
