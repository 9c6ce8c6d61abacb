"""The results store: schema readable without lmprof, load_results columns, failed runs as NaN, never zeros."""
from __future__ import annotations

import math
import sqlite3

import pytest

import lmprof
from lmprof.errors import DataError
from lmprof.record.store import Store, load_blocks, metric_column
from sweep_fakes import FAILED, fake_sweep


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return fake_sweep(tmp_path_factory.mktemp("fake-sweep"))


@pytest.mark.parametrize(
    "key,unit,column",
    [
        ("step_time", "ms", "step_time_ms"),
        ("tokens_per_s", "tokens/s", "tokens_per_s"),
        ("mfu", "%", "mfu_pct"),
        ("memory.peak", "B", "memory_peak_bytes"),
        ("energy.per_token", "J/token", "energy_per_token_j"),
        ("energy.flop_per_joule", "FLOP/J", "energy_flop_per_joule"),
        ("peak.flops", "FLOP/s", "peak_flops_flop_per_s"),
        ("params", "count", "params"),
        ("ttft", "ms", "ttft_ms"),
    ],
)
def test_metric_column_names(key, unit, column):
    assert metric_column(key, unit) == column


def test_load_results_one_row_per_point_with_flat_config_and_metrics(fake):
    df = lmprof.load_results(fake)
    assert len(df) == 16 and df["id"].is_unique
    for col in ("id", "label", "status", "message", "mode", "model", "batch_size", "seq_len", "device", "dtype",
                "compile", "attention", "repeat", "n_layer", "n_head", "n_embd", "config", "run_dir", "started",
                "finished", "duration_s", "step_time_ms", "tokens_per_s", "mfu_pct", "memory_peak_bytes",
                "energy_per_token_j", "decode_tokens_per_s", "loss", "params"):
        assert col in df.columns, col
    assert df.attrs["units"]["step_time_ms"] == "ms" and df.attrs["units"]["mfu_pct"] == "%"
    assert set(df["status"]) == {"ok", "oom", "timeout"}
    wide = df[df["model"] == "wide"].iloc[0]
    assert (wide["n_layer"], wide["n_head"], wide["n_embd"]) == (2, 4, 256)
    for (mode, model, b, t), (status, message) in FAILED.items():
        row = df[(df["mode"] == mode) & (df["model"] == model) & (df["batch_size"] == b) & (df["seq_len"] == t)].iloc[0]
        assert row["status"] == status and row["message"] == message
        assert math.isnan(row["mfu_pct"]) and math.isnan(row["memory_peak_bytes"])  # n/a, not zero
    assert df[df["mode"] == "infer"]["step_time_ms"].isna().all()


def test_store_is_readable_with_plain_sqlite(fake):
    conn = sqlite3.connect(fake / "results.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "lmprof.sweep/1"
    rows = conn.execute("SELECT status, COUNT(*) FROM points GROUP BY status").fetchall()
    assert dict(rows) == {"ok": 14, "oom": 1, "timeout": 1}
    ok = conn.execute("SELECT step_time_ms, tokens_per_s, mfu_pct FROM results WHERE status='ok' AND mode='train'")
    assert all(v is not None for row in ok.fetchall() for v in row)
    n_metrics = conn.execute("SELECT COUNT(DISTINCT point_id) FROM metrics").fetchone()[0]
    assert n_metrics == 14  # failed points have no metric rows
    conn.close()


def test_load_blocks_joins_the_point_axes(fake):
    blocks = load_blocks(fake)
    wanted = {"point_id", "name", "phase", "time_ms", "flops", "bytes", "mode", "model", "batch_size"}
    assert wanted <= set(blocks.columns)
    assert set(blocks["phase"]) == {"forward", "backward", "step", "prefill", "decode"}
    assert blocks["point_id"].nunique() == 14


def test_not_a_store_is_a_one_line_error(tmp_path):
    with pytest.raises(DataError, match="no sweep results"):
        lmprof.load_results(tmp_path)
    (tmp_path / "results.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DataError, match="not an lmprof sweep store"):
        lmprof.load_results(tmp_path)


def test_a_rerun_point_replaces_its_figures(tmp_path):
    fake_sweep(tmp_path)
    df = lmprof.load_results(tmp_path)
    pid = df[df["status"] == "ok"]["id"].iloc[0]
    with Store(tmp_path / "results.sqlite") as store:
        store.mark_running(pid, f"runs/{pid}", "2026-01-02T00:00:00+00:00")
        store.finish(pid, "error", "boom", "2026-01-02T00:00:01+00:00", 1.0)
    row = lmprof.load_results(tmp_path).set_index("id").loc[pid]
    assert row["status"] == "error" and row["attempts"] == 2 and math.isnan(row["step_time_ms"])
