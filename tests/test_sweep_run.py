"""Real sweeps of a one-layer, 32-wide GPT: isolation, statuses, the store, plots, kill and resume.

Every point is a fresh Python process (a few seconds of torch import each), so these tests use few
points: one module-scoped sweep of four points serves several tests.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import lmprof
from lmprof.errors import ConfigError
from lmprof.show.sweep_plots import make_plots
from lmprof.sweep.runner import run_sweep
from lmprof.sweep.spec import parse_spec
from lmprof.sweep.worker import FAKE_OOM_ENV

MINI = {"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32}
BAD = {"name": "bad", "n_layer": 1, "n_head": 3, "n_embd": 32}  # 32 is not divisible by 3: an error point
FAST = {"steps": 1, "warmup": 0, "profile_steps": 1, "new_tokens": 2, "seq_lens": [16], "devices": ["cpu"],
        "energy": "off", "timeout_s": 120}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """mini train + mini infer (ok), bad train (error), bad infer (fake OOM): run once, checked by several tests."""
    out = tmp_path_factory.mktemp("sweep")
    spec = parse_spec({**FAST, "models": [MINI, BAD], "modes": ["train", "infer"], "batch_sizes": [2]})
    oom_id = next(p.id for p in spec.expand().points if p.model == "bad" and p.mode == "infer")
    old = os.environ.get(FAKE_OOM_ENV)
    os.environ[FAKE_OOM_ENV] = oom_id
    try:
        summary = run_sweep(spec, out)
    finally:
        if old is None:
            os.environ.pop(FAKE_OOM_ENV, None)
        else:
            os.environ[FAKE_OOM_ENV] = old
    return out, summary


def test_failures_are_isolated_and_recorded_with_their_reason(finished):
    out, summary = finished
    assert summary.counts == {"ok": 2, "error": 1, "oom": 1}
    df = lmprof.load_results(out).set_index(["model", "mode"])
    assert df.loc[("mini", "train"), "status"] == "ok"
    assert df.loc[("mini", "infer"), "status"] == "ok"
    err = df.loc[("bad", "train")]
    assert err["status"] == "error"
    assert err["message"] == "n_embd (32) must be divisible by n_head (3)"  # the last line, not a traceback
    oom = df.loc[("bad", "infer")]
    assert oom["status"] == "oom" and "out of memory" in oom["message"] and FAKE_OOM_ENV in oom["message"]
    assert (out / "runs" / err["id"] / "worker.log").is_file()


def test_the_store_has_every_ok_run_with_its_figures(finished):
    out, _ = finished
    df = lmprof.load_results(out)
    ok = df[df["status"] == "ok"].set_index("mode")
    assert ok.loc["train", "step_time_ms"] > 0 and ok.loc["train", "tokens_per_s"] > 0
    assert ok.loc["infer", "ttft_ms"] > 0 and ok.loc["infer", "decode_tokens_per_s"] > 0
    for run_dir in ok["run_dir"]:
        assert lmprof.load_run(run_dir).metrics
    conn = sqlite3.connect(out / "results.sqlite")
    blocks = conn.execute("SELECT COUNT(*) FROM blocks b JOIN points p ON p.id = b.point_id "
                          "WHERE p.mode='train' AND b.name='attn.qkv'").fetchone()[0]
    conn.close()
    assert blocks >= 2  # forward and backward rows of the ok training run


@pytest.mark.slow
def test_plots_for_a_small_finished_sweep(finished, tmp_path):
    out, _ = finished
    results = {r.name: r for r in make_plots(out, tmp_path)}
    for name in ("blocks_train.png", "blocks_infer.png", "blocks_share_train.png", "attention_train.png",
                 "mlp_infer.png"):
        assert results[name].path is not None and results[name].path.stat().st_size > 5000, name
    # One batch size, one model, no energy meter, no FLOP counts: skipped, each with its reason.
    assert "only one batch size" in results["throughput_vs_batch.png"].skipped
    assert "only one model" in results["radar_train.png"].skipped
    assert results["energy_per_token_vs_batch.png"].skipped
    assert results["roofline.png"].skipped or results["roofline.png"].path.stat().st_size > 5000


def test_an_existing_sweep_needs_resume(finished):
    out, _ = finished
    spec = parse_spec({**FAST, "models": [MINI], "batch_sizes": [2]})
    with pytest.raises(ConfigError, match="--resume"):
        run_sweep(spec, out)


def test_a_hang_is_killed_at_the_timeout(tmp_path):
    # A point that cannot finish in time (with torch imported once and bytecode cached, a 1-step point
    # now finishes inside 0.5 s): 100,000 clean steps, tens of seconds at the least, yet under the hour
    # beyond which the run refuses to start (pipeline/budget.py) even at 36 ms a step on a busy machine.
    spec = parse_spec({**FAST, "models": [MINI], "batch_sizes": [2], "steps": 100_000, "timeout_s": 0.5})
    summary = run_sweep(spec, tmp_path)
    assert summary.counts == {"timeout": 1}
    row = lmprof.load_results(tmp_path).iloc[0]
    assert row["status"] == "timeout" and "0.5 s" in row["message"]


def _statuses(db: Path) -> dict[str, tuple[str, str, int]]:
    conn = sqlite3.connect(db, timeout=10)
    try:
        return {r[0]: (r[1], r[2], r[3]) for r in conn.execute("SELECT id, status, finished, attempts FROM points")}
    except sqlite3.OperationalError:  # created but no tables yet
        return {}
    finally:
        conn.close()


@pytest.mark.slow
def test_killed_midway_then_resumed_loses_nothing(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({**FAST, "models": [MINI], "modes": ["train"], "batch_sizes": [1, 2]}))
    out = tmp_path / "out"
    db = out / "results.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.cli.main", "sweep", str(spec_file), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # liveness only: on 2 loaded cores one point has taken a minute
    first: dict[str, tuple[str, str, int]] = {}
    while time.monotonic() < deadline:
        first = {k: v for k, v in (_statuses(db) if db.exists() else {}).items() if v[0] == "ok"}
        if first or proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # the hardest stop: no handler runs
    proc.wait(timeout=10)
    assert first, "no point finished before the deadline"
    # An orphaned worker leaves within a second of its runner's death, even one started just before the
    # kill (the runner hands it its pid); one still alive is waited for by the resumed sweep.
    time.sleep(1.5)
    before = _statuses(db)
    assert sum(v[0] == "ok" for v in before.values()) == 1

    spec = parse_spec(yaml.safe_load(spec_file.read_text()))
    summary = run_sweep(spec, out, resume=True)
    after = _statuses(db)
    assert summary.skipped_ok == sum(v[0] == "ok" for v in before.values())
    assert summary.counts == {"ok": 1}
    assert all(v[0] == "ok" for v in after.values()) and len(after) == 2
    for pid, (status, finished_at, attempts) in before.items():
        if status == "ok":  # never run again: same finish time, one attempt
            assert after[pid] == (status, finished_at, attempts) and attempts == 1
