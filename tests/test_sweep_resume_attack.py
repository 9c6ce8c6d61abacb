"""Sweep resume after a spec change, a symlinked run folder, energy: estimate without tdp_w, and the
exit code of a sweep with failed points (issue 29 item 10). No worker runs torch here."""
from __future__ import annotations

import sqlite3

import pytest

from lmprof.errors import ConfigError, DataError
from lmprof.record.store import DB_NAME, Store
from lmprof.sweep import runner
from lmprof.sweep.runner import SweepSummary, run_point, run_sweep
from lmprof.sweep.spec import parse_spec

WIDE = {"name": "wide", "n_layer": 2, "n_head": 4, "n_embd": 128}


def _one_line(code: int, err: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err


def _record_ok(out, spec) -> None:
    """A sweep folder in which every point of ``spec`` finished ok (recorded without running)."""
    plan = spec.expand()
    with Store(out / DB_NAME) as store:
        store.plan(plan.points, spec.model_dump_json())
        for p in plan.points:
            store.finish(p.id, "ok", None, "2026-01-01T00:00:00+00:00", 1.0)


def test_a_changed_model_under_the_same_name_is_not_a_repeat(tmp_path, cli):
    old = parse_spec({"models": [WIDE], "devices": ["cpu"]})
    new = parse_spec({"models": [{**WIDE, "n_embd": 256}], "devices": ["cpu"]})
    (a,), (b,) = old.expand().points, new.expand().points
    assert a.label == b.label and a.id != b.id  # the id hashes the resolved config
    out = tmp_path / "sw"
    _record_ok(out, old)
    with pytest.raises(DataError, match=r"model_spec\.n_embd: 128 -> 256"):
        run_sweep(new, out, resume=True)
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [{name: wide, n_layer: 2, n_head: 4, n_embd: 256}]\ndevices: [cpu]\n")
    code, _, err = cli("sweep", spec, "--out", out, "--resume")
    _one_line(code, err)
    assert "n_embd: 128 -> 256" in err and "new name" in err
    rows = sqlite3.connect(out / DB_NAME).execute("SELECT id, status FROM points").fetchall()
    assert rows == [(a.id, "ok")]  # nothing recorded was lost, nothing new was planned


def test_a_renamed_changed_model_is_a_new_point(tmp_path):
    old = parse_spec({"models": [WIDE], "devices": ["cpu"]})
    out = tmp_path / "sw"
    _record_ok(out, old)
    new = parse_spec({"models": [WIDE, {**WIDE, "name": "wider", "n_embd": 256}], "devices": ["cpu"]})
    with Store(out / DB_NAME) as store:
        store.plan(new.expand().points, new.model_dump_json())
        assert sorted(store.statuses().values()) == ["ok", "pending"]


def test_a_run_folder_replaced_by_a_symlink_is_unlinked_not_followed(tmp_path):
    (point,) = parse_spec({"models": ["tiny"], "devices": ["cpu"]}).expand().points
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    run_dir = tmp_path / "sw" / "runs" / point.id
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(victim, target_is_directory=True)
    # /bin/true stands in for the worker: it exits 0 without a record, an ordinary failed point.
    outcome = run_point(point, run_dir, timeout_s=30, python="/bin/true")
    assert outcome.status == "error" and "without writing a run record" in (outcome.message or "")
    assert (victim / "keep.txt").read_text() == "mine"
    assert run_dir.is_dir() and not run_dir.is_symlink() and (run_dir / "point.json").is_file()
    run_dir_file = tmp_path / "sw" / "runs" / "afile"
    run_dir_file.write_text("x")
    assert run_point(point, run_dir_file, timeout_s=30, python="/bin/true").status == "error"


def test_energy_estimate_without_tdp_is_refused_up_front(tmp_path, cli):
    with pytest.raises(ConfigError, match="tdp_w"):
        parse_spec({"models": ["tiny"], "energy": "estimate"})
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nenergy: estimate\n")
    code, _, err = cli("sweep", spec, "--dry-run", "--out", tmp_path / "o")
    _one_line(code, err)
    assert "tdp_w" in err
    ok = parse_spec({"models": ["tiny"], "energy": "estimate", "tdp_w": 65})
    (point,) = ok.expand().points
    assert point.run_values("o")["tdp_w"] == 65
    # Specs without tdp_w keep their point ids (None is left out of the hash): --resume still works.
    plain = parse_spec({"models": ["tiny"]}).expand().points[0]
    assert "tdp_w" not in plain.model_dump(exclude_none=True)


def test_a_sweep_with_failed_points_exits_1(tmp_path, cli, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\ndevices: [cpu]\n")

    def fake(summary):
        return lambda *a, **k: summary

    monkeypatch.setattr(runner, "run_sweep", fake(SweepSummary(total=2, counts={"ok": 1, "oom": 1})))
    code, out, _ = cli("sweep", spec, "--out", tmp_path / "a")
    assert code == 1 and "1 point(s) failed: exit code 1" in out
    monkeypatch.setattr(runner, "run_sweep", fake(SweepSummary(total=2, skipped_ok=1, skipped_failed=1)))
    assert cli("sweep", spec, "--out", tmp_path / "b", "--resume", "--skip-failed")[0] == 1
    monkeypatch.setattr(runner, "run_sweep", fake(SweepSummary(total=1, counts={"ok": 1})))
    assert cli("sweep", spec, "--out", tmp_path / "c")[0] == 0
