"""Plots as a reader sees them (issue 49, item 11): log axes labelled 10¹³, not raw mathtext; an
inference memory plot with one label per run of decode steps and the KV cache as its own band; and
``analyze --diff``'s help in the order its usage and the docs give.

PNGs are drawn for real and the drawn texts read back from the figure (its Text artists after the
draw); the memory timeline comes from a trace written event by event, its bands worked out by hand.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmprof.estimate.roofline import RooflinePoint
from lmprof.show.literal import plain_math

MIB = 2**20


def test_log_labels_become_plain_text_by_hand():
    assert plain_math("$\\mathdefault{10^{13}}$") == "10\u00b9\u00b3"
    assert plain_math("$\\mathdefault{2\\times10^{-3}}$") == "2\u00d710\u207b\u00b3"
    assert plain_math("$\\mathdefault{2^{3}}$") == "2\u00b3"
    assert plain_math("cost $5 vs $10") == "cost $5 vs $10"  # anything else is left as it is


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures saved while the test runs."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    save = Figure.savefig

    def keep(self: Any, *a: Any, **k: Any) -> Any:
        figures.append(self)
        return save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def test_roofline_axes_are_labelled_in_decades_and_user_text_stays_literal(tmp_path, drawn):
    from lmprof.show.roofline_plot import plot_roofline

    points = [RooflinePoint(name="mlp $5 vs $10", phase="forward", flops=4e10, bytes=2e8, intensity=200.0,
                            bound="compute-bound", attainable_flops_per_s=1e13, min_time_s=None),
              RooflinePoint(name="x$\\frac{$y", phase="forward", flops=1e7, bytes=1e8, intensity=0.1,
                            bound="memory-bound", attainable_flops_per_s=2e11, min_time_s=None)]
    out = plot_roofline(points, peak_flops=1e13, peak_bytes_per_s=2e12, out=tmp_path / "r.png", device="cpu",
                        dtype="fp32", model="m $1")
    assert out.read_bytes().startswith(b"\x89PNG")
    (fig,) = drawn
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text()]
    assert ticks and not any("$" in t or "mathdefault" in t for t in ticks), ticks
    # the y range holds 2e11 .. 1e13 (y_range: /4 below, x3 above): every decade in it is labelled
    assert {"10\u00b9\u00b2", "10\u00b9\u00b3"} <= set(ticks)
    assert "10\u207b\u00b9" in ticks  # intensity 0.1: a negative power
    texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_parse_math")) if "$" in t.get_text()]
    assert texts and all(t.get_parse_math() is False for t in texts)  # the user's dollars: drawn as written


def _mem(ts: float, nbytes: int, addr: int) -> dict[str, Any]:
    return {"ph": "i", "name": "[memory]", "ts": ts,
            "args": {"Bytes": nbytes, "Addr": addr, "Device Type": 0, "Device Id": -1, "Ev Idx": 0}}


def _phase(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"lmprof:{name}", "ts": ts, "dur": dur}


DECODE_STEPS = 49


@pytest.fixture
def generation(tmp_path: Path) -> Path:
    """A generation of 49 decode steps: the prefill allocates the KV cache (4 MiB, kept) and a
    temporary (1 MiB, freed in it) and hands 0.2 MiB of logits to the first decode step; each decode
    step allocates a temporary (0.5 MiB, freed in it) and new logits, and frees the ones it was given."""
    logits = MIB // 5
    events = [_phase("prefill", 0, 100), _mem(5, 4 * MIB, 1), _mem(10, MIB, 2), _mem(50, -MIB, 2),
              _mem(90, logits, 100)]
    for k in range(DECODE_STEPS):
        t = 100 + 50 * k
        events += [_phase("decode", t, 50), _mem(t + 5, MIB // 2, 3), _mem(t + 30, logits, 101 + k),
                   _mem(t + 31, -logits, 100 + k), _mem(t + 40, -(MIB // 2), 3)]
    path = tmp_path / "generation.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_generation_keeps_its_kv_cache_in_a_band_of_its_own(generation):
    from lmprof.measure.memory_timeline import timeline_from_trace

    tl = timeline_from_trace(generation, "cpu", {"params": 2 * MIB})
    end = {c: v[-1] for c, v in tl.categories.items() if v[-1]}
    # kept at the end: the cache and the last step's logits; every temporary was freed in its own step
    assert end == {"params": 2 * MIB, "kv_cache": 4 * MIB + MIB // 5}
    # within a decode step its temporary is a temporary, though freed by "decode" as the next ones are
    k = tl.t_ms.index((100 + 5) / 1e3)
    assert tl.categories["temporaries"][k] == MIB // 2 and tl.categories["kv_cache"][k] == 4 * MIB + MIB // 5
    assert tl.allocated[-1] == 2 * MIB + 4 * MIB + MIB // 5


def test_the_inference_memory_plot_labels_a_run_of_decode_steps_once(tmp_path, generation, drawn):
    from lmprof.measure.memory_timeline import timeline_from_trace
    from lmprof.show.memory_plot import plot_memory_timeline

    tl = timeline_from_trace(generation, "cpu", {"params": 2 * MIB})
    plot_memory_timeline(tl, tmp_path / "memory.png", "tiny, prompt 6 + 50 new tokens")
    (fig,) = drawn
    for ax in fig.axes:
        phase_labels = [t.get_text() for t in ax.texts if "decode" in t.get_text() or "prefill" in t.get_text()]
        assert phase_labels.count(f"decode \u00d7{DECODE_STEPS}") == 1, phase_labels
        assert not [t for t in phase_labels if t == "decode"]  # not 49 labels on top of each other
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("KV cache") and "4.0 MiB at peak" in t for t in legend), legend


def test_analyze_diff_help_gives_the_order_its_usage_and_the_docs_give(cli, tmp_path):
    docs = (Path(__file__).parents[1] / "docs" / "trace-analysis.md").read_text()
    assert "lmprof analyze --diff before.json after.json" in docs  # the docs' order: the option's value first
    code, out, _ = cli("analyze", "--help")
    helptext = " ".join(out.split())
    assert "The trace before a change, compared with the PATH argument, the trace after it" in helptext
    assert "--diff BEFORE AFTER" in helptext
    traces = Path(__file__).parent / "data" / "traces"
    before, after = traces / "cpu_only_tiny.json.gz", traces / "cpu_ops_only.json.gz"
    code, out, err = cli("analyze", "--diff", before, after, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["before"], doc["after"]) == (str(before), str(after))


def test_the_memory_plot_leaves_the_users_backend_and_says_a_small_peak_in_figures(tmp_path, drawn, monkeypatch):
    """lmprof.profile() draws memory.png inside the user's process: it called matplotlib.use("Agg"), so a
    script on the svg (or a notebook's inline) backend read Agg after the with-block; and a 17 KiB peak
    was labelled "0.0 MiB"."""
    import matplotlib

    from lmprof.measure.memory_timeline import MemoryTimeline, Phase
    from lmprof.show.memory_plot import plot_memory_timeline

    switched: list[Any] = []
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: switched.append(a))
    before = matplotlib.get_backend()
    params, grads = 8_448, 8_448  # a 16 x 64 x 16 MLP's fp32 weights and biases, and their grads
    tl = MemoryTimeline(t_ms=[0.0, 0.5, 1.0], allocated=[params, params + grads, params],
                        categories={"params": [params] * 3, "grads": [0, grads, 0]},
                        phases=[Phase("forward", 0.0, 0.4), Phase("backward", 0.4, 1.0)], baseline=params,
                        device="cpu", peak=params + grads, peak_ms=0.5, peak_phase="backward", activations=0, events=3)
    plot_memory_timeline(tl, tmp_path / "memory.png", "tiny", estimated_peak=20_000)
    assert switched == [] and matplotlib.get_backend() == before
    (fig,) = drawn
    texts = [t.get_text() for t in fig.axes[0].texts] + [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    want = f"{(params + grads) / 2**20:.2g}"  # 0.016 MiB
    assert f"peak {want} MiB (backward)" in texts, texts
    assert f"grads ({grads / 2**20:.2g} MiB at peak)" in texts and f"estimated peak {20_000 / 2**20:.2g} MiB" in texts
    assert not any("0.0 MiB" in t for t in texts), texts
