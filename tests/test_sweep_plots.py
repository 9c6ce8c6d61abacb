"""Sweep plots from a fabricated store where every figure exists, and the reasons when figures are missing."""
from __future__ import annotations

import sqlite3

import pytest

from lmprof.show.sweep_plots import load_sweep, make_plots, plot_energy, plot_mfu, plot_radar, plot_roofline
from sweep_fakes import fake_sweep

ALL = {
    "blocks_train.png", "blocks_share_train.png", "blocks_infer.png", "blocks_share_infer.png",
    "attention_train.png", "mlp_train.png", "attention_infer.png", "mlp_infer.png",
    "throughput_vs_batch.png", "throughput_vs_seq_len.png", "energy_per_token_vs_batch.png",
    "flop_per_joule_vs_batch.png", "mfu_vs_batch.png", "radar_train.png", "radar_infer.png", "roofline.png",
}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return fake_sweep(tmp_path_factory.mktemp("fake-sweep"))


@pytest.mark.slow
def test_every_plot_is_written_when_every_figure_exists(fake):
    results = make_plots(fake)
    assert {r.name for r in results} == ALL
    for r in results:
        assert r.skipped is None, f"{r.name}: {r.skipped}"
        assert r.path == fake / "plots" / r.name and r.path.stat().st_size > 10_000


def test_missing_figures_skip_their_plots_with_the_reason(tmp_path):
    fake_sweep(tmp_path)
    conn = sqlite3.connect(tmp_path / "results.sqlite")
    with conn:
        conn.execute("DELETE FROM metrics WHERE key LIKE 'energy.%' OR key IN ('mfu', 'memory.peak')")
        conn.execute("INSERT INTO metrics SELECT id, 'energy.total', NULL, 'J', 'measured', NULL, NULL, NULL, "
                     "'no RAPL powercap interface here' FROM points WHERE status = 'ok'")
        conn.execute("UPDATE blocks SET flops = NULL")
    conn.close()
    data, out = load_sweep(tmp_path), tmp_path / "p"
    assert "no RAPL powercap interface here" in plot_energy(data, "per_token", out).skipped
    assert "no RAPL powercap interface here" in plot_energy(data, "flop_per_joule", out).skipped
    assert "no MFU" in plot_mfu(data, out).skipped
    assert "needs 3 axes" in plot_radar(data, "infer", out).skipped  # throughput only: no energy, mfu or memory
    assert "flops and bytes" in plot_roofline(data, out).skipped
    assert not out.exists()  # nothing half-drawn


def test_noisy_runs_are_named_and_ringed(fake):
    """The fabricated sweep has one noisy ok run (sweep_fakes.NOISY): the store keeps the flag with its
    reason, and every plot's footer names the run."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from lmprof.record.store import load_results
    from lmprof.show import sweep_plots
    from sweep_fakes import NOISY

    runs = load_results(fake)
    flagged = runs[runs["noisy"] == 1]
    assert len(flagged) == 1 and (runs[runs["status"] == "ok"]["noisy"].notna()).all()
    (mode, model, batch, seq), reason = next(iter(NOISY.items()))
    row = flagged.iloc[0]
    assert (row["mode"], row["model"], row["batch_size"], row["seq_len"]) == (mode, model, batch, seq)
    conn = sqlite3.connect(fake / "results.sqlite")
    (note,) = conn.execute("SELECT note FROM metrics WHERE key = 'noisy' AND value = 1").fetchone()
    conn.close()
    assert note == reason
    data = load_sweep(fake)
    footer = " ".join(data.footer())
    assert "noisy runs kept" in footer and "(1 of " in footer and str(row["label"]) in footer
    assert data.noisy_note("infer") == ""  # the noisy run is a training run
    rings = []
    real_plot = plt.Axes.plot

    def spy(ax, *args, **kwargs):
        if kwargs.get("mfc") == "none":
            rings.append((list(args[0]), list(args[1])))
        return real_plot(ax, *args, **kwargs)

    plt.Axes.plot = spy
    try:
        sweep_plots.plot_metric_vs(data, "batch_size", {"train": "tokens_per_s"}, {"train": "tokens/s"},
                                   "throughput", "t.png", fake / "check")  # fmt: skip
    finally:
        plt.Axes.plot = real_plot
    assert [xs for xs, _ in rings] == [[batch]]  # one ring, at the noisy run's batch size
