"""`lmprof sweep`, `lmprof results` and `lmprof plots` from the command line (no point is run here)."""
from __future__ import annotations

import sqlite3

import pandas as pd

from sweep_fakes import fake_sweep


def _one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (out, err)
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in out + err


def test_bad_spec_is_one_line_exit_2(cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: []\n")
    _one_line_error(*cli("sweep", spec, "--out", tmp_path / "o"), "batch_sizes: must not be empty")
    spec.write_text("models: [tiny]\nexclude: [{device: cpu, flavour: x}]\n")
    _one_line_error(*cli("sweep", spec, "--out", tmp_path / "o"), "unknown key 'flavour'")
    _one_line_error(*cli("sweep", tmp_path / "none.yaml"), "not found")


def test_dry_run_lists_the_points(cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: [1, 2]\nmodes: [train, infer]\n"
                    "exclude: [{mode: infer, batch_size: 2}, {dtype: bf16}]\n")
    code, out, err = cli("sweep", spec, "--dry-run", "--out", tmp_path / "o")
    assert code == 0, err
    assert "3 points (1 excluded by the rules)" in out
    assert "exclude rule {'dtype': 'bf16'} matches no point" in out
    assert "train tiny b2 t64 auto fp32 math" in out
    assert not (tmp_path / "o").exists()


def test_existing_results_need_resume(cli, tmp_path):
    fake_sweep(tmp_path)
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\n")
    _one_line_error(*cli("sweep", spec, "--out", tmp_path), "pass --resume to continue")


def test_results_table_and_exports(cli, tmp_path):
    fake_sweep(tmp_path)
    code, out, err = cli("results", tmp_path)
    assert code == 0, err
    assert "16 points" in out and "14 ok, 1 oom, 1 timeout" in out.replace("\n", " ")
    assert "oom" in out and "out of memory" in out  # the reason of each failed point
    # The store's noisy flag is a column: the one noisy run of the fake sweep (sweep_fakes.NOISY) is marked.
    header = next(line for line in out.splitlines() if " status " in line)
    assert header.split()[:3] == ["id", "status", "noisy"] and out.count("NOISY") == 2  # its row, the count
    assert "1 NOISY" in out
    csv, parquet = tmp_path / "all.csv", tmp_path / "all.parquet"
    code, out, err = cli("results", tmp_path, "--csv", csv, "--parquet", parquet)
    assert code == 0, err
    a, b = pd.read_csv(csv), pd.read_parquet(parquet)
    assert len(a) == len(b) == 16
    assert {"status", "model", "batch_size", "step_time_ms", "mfu_pct"} <= set(a.columns)
    _one_line_error(*cli("results", tmp_path / "nothing"), "no sweep results")


def test_plots_command_reports_written_and_skipped(cli, tmp_path):
    fake_sweep(tmp_path)
    conn = sqlite3.connect(tmp_path / "results.sqlite")
    with conn:  # keep it quick: no blocks, only throughput figures
        conn.execute("DELETE FROM blocks")
        conn.execute("DELETE FROM metrics WHERE key NOT IN ('tokens_per_s', 'decode_tokens_per_s', 'params')")
    conn.close()
    code, out, err = cli("plots", tmp_path, "--out", tmp_path / "png")
    assert code == 0, err
    assert "throughput_vs_batch.png" in out and "skipped mfu_vs_batch.png: no MFU" in out
    assert (tmp_path / "png" / "throughput_vs_seq_len.png").stat().st_size > 10_000
