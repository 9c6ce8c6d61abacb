"""Sweeps take any model: Hugging Face configs (random weights) and a user's own script (issue 31).

Store rows are read with the sqlite3 module directly, never through lmprof's loader. The independent
truths: transformers' own parameter count of the architecture a point names, and the arguments the
script itself wrote down from its sys.argv.
"""
from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from lmprof.errors import ConfigError
from lmprof.sweep.runner import run_sweep
from lmprof.sweep.script import ScriptPoint
from lmprof.sweep.spec import load_spec, parse_spec

FAST = {"steps": 1, "warmup": 1, "profile_steps": 1, "timeout_s": 180}
ODD = "a b $HOME `x` ü 'q'"  # spaces, a shell variable, backticks, unicode, quotes: one argv element

# The script writes its own argv (as it received it) to --record, then trains a tiny model; it fails
# at --batch_size 3 while the file --fail_if exists, so one sweep has an error point and a resume
# (once the file is gone) runs that point again.
SCRIPT = """
import argparse, json, os, sys
import torch
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--block_size", type=int, default=16)
p.add_argument("--tag", default="")
p.add_argument("--record", required=True)
p.add_argument("--fail_if", default="")
a = p.parse_args()
with open(a.record, "a", encoding="utf-8") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if a.batch_size == 3 and a.fail_if and os.path.exists(a.fail_if):
    raise ValueError("boom at batch 3")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randint(0, 64, (a.batch_size, a.block_size))
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _rows(out: Path) -> dict[str, dict[str, object]]:
    """Every point row of the store, by label, read with sqlite3 (not lmprof's loader)."""
    conn = sqlite3.connect(out / "results.sqlite")
    conn.row_factory = sqlite3.Row
    try:
        return {r["label"]: dict(r) for r in conn.execute("SELECT * FROM points")}
    finally:
        conn.close()


def _metric(out: Path, point_id: object, key: str) -> float | None:
    conn = sqlite3.connect(out / "results.sqlite")
    try:
        row = conn.execute("SELECT value FROM metrics WHERE point_id = ? AND key = ?", (point_id, key)).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


# -- Hugging Face configs --------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_over_a_tiny_hf_config(tmp_path: Path) -> None:
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=128)
    path = tmp_path / "tiny-gpt2.json"
    cfg.to_json_file(path)
    spec = parse_spec({**FAST, "models": [{"hf_config": str(path), "n_layer": 1}, {"hf_config": str(path), "n_layer": 2}],
                       "batch_sizes": [2], "seq_lens": [16], "devices": ["cpu"], "energy": "off"})
    out = tmp_path / "sweep"
    summary = run_sweep(spec, out)
    assert summary.counts == {"ok": 2}
    rows = _rows(out)
    assert len(rows) == 2
    for layers in (1, 2):
        row = next(r for r in rows.values() if r["n_layer"] == layers)
        assert row["status"] == "ok" and row["model"] == f"{path}-L{layers}"
        assert json.loads(str(row["config"]))["model_spec"] == {"hf_config": str(path), "n_layer": layers}
        assert (row["batch_size"], row["seq_len"]) == (2, 16)
        assert (_metric(out, row["id"], "step_time") or 0) > 0
        # transformers' own count of the architecture this point names (n_layer overridden)
        model = tf.AutoModelForCausalLM.from_config(tf.GPT2Config(**{**cfg.to_dict(), "n_layer": layers}))
        assert _metric(out, row["id"], "params") == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)


def test_hf_config_entries_are_validated_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cases = [
        ({"models": [{"hf_config": "gpt2", "n_embd": 32}]}, "models.0: hf_config takes only name and n_layer, not n_embd"),
        ({"models": [{"hf_config": "no-such-arch"}]}, "models: entry 0: hf_config: unknown --hf-config 'no-such-arch'"),
        ({"models": [{"hf_config": str(tmp_path / "missing.json")}]}, "models: entry 0: hf_config: config not found"),
        ({"models": [{"hf_config": "gpt2", "n_layer": 0}]}, "models.0: n_layer must be positive"),
    ]
    for values, needle in cases:
        with pytest.raises(ConfigError) as err:
            parse_spec(values, where="s.yaml")
        assert str(err.value).startswith("s.yaml: ") and needle in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
    plan = parse_spec({"models": ["tiny", {"hf_config": "tiny-gpt2", "n_layer": 1}]}).expand()
    assert [p.model for p in plan.points] == ["tiny", "tiny-gpt2-L1"]
    assert plan.points[1].model_spec == {"hf_config": "tiny-gpt2", "n_layer": 1}
    # what the worker hands to TrainConfig: exactly the options `lmprof train --hf-config tiny-gpt2 --n-layer 1` sets
    values = plan.points[1].run_values(out="o")
    assert values["hf_config"] == "tiny-gpt2" and values["n_layer"] == 1 and "preset" not in values


# -- a user's script ---------------------------------------------------------------------------------
def _script_spec(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    spec = {
        "script": str(script), "name": "toy",
        "args": {"--batch_size": [3, 2], "--block_size": [8]},  # the failing point first: the sweep goes on
        "fixed_args": ["--record", str(tmp_path / "argv.jsonl"), "--tag", ODD, "--fail_if", str(tmp_path / "fail")],
        "batch_size_arg": "--batch_size", "seq_len_arg": "--block_size", **FAST, "timeout_s": 240,
    }
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return path


def _received(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_sweep_over_a_user_script_records_failures_and_resumes(tmp_path: Path) -> None:
    spec = load_spec(_script_spec(tmp_path))
    out = tmp_path / "sweep"
    (tmp_path / "fail").write_text("")
    summary = run_sweep(spec, out)
    assert summary.counts == {"error": 1, "ok": 1}
    rows = _rows(out)
    bad, good = rows["train toy --batch_size=3 --block_size=8"], rows["train toy --batch_size=2 --block_size=8"]
    assert bad["message"] == "the script exited with code 1: ValueError: boom at batch 3"  # its exception, no traceback
    assert good["status"] == "ok" and good["message"] is None
    # the script received every argument as one argv element, the odd string untouched by any shell
    fixed = ["--record", str(tmp_path / "argv.jsonl"), "--tag", ODD, "--fail_if", str(tmp_path / "fail")]
    assert _received(tmp_path) == [[*fixed, "--batch_size", "3", "--block_size", "8"],
                                   [*fixed, "--batch_size", "2", "--block_size", "8"]]
    # the store: axis columns from the mapped arguments, the point's config with its arguments, a run folder
    assert (good["batch_size"], good["seq_len"], good["mode"], good["model"]) == (2, 8, "train", "toy")
    config = json.loads(str(good["config"]))
    assert config["argv"] == [*fixed, "--batch_size", "2", "--block_size", "8"]
    assert config["grid"] == {"--batch_size": "2", "--block_size": "8"}
    assert (_metric(out, good["id"], "step_time") or 0) > 0
    run_json = json.loads((out / str(good["run_dir"]) / "run.json").read_text())
    assert run_json["config"]["script_args"] == config["argv"]  # lmprof run's own record of the arguments

    # resume once the cause is gone: the ok point is skipped, the failed one runs again
    (tmp_path / "fail").unlink()
    summary = run_sweep(spec, out, resume=True)
    assert (summary.skipped_ok, summary.counts) == (1, {"ok": 1})
    rows = _rows(out)
    assert rows["train toy --batch_size=3 --block_size=8"]["status"] == "ok"
    assert rows["train toy --batch_size=3 --block_size=8"]["attempts"] == 2
    assert rows["train toy --batch_size=2 --block_size=8"]["attempts"] == 1
    assert len(_received(tmp_path)) == 3  # the skipped point's script never ran again
    for row in rows.values():
        assert (_metric(out, row["id"], "step_time") or 0) > 0


def test_script_points_are_keyed_by_their_whole_config(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    base = {"script": str(script), "args": {"--lr": [0.1, "1e-3"]}, "fixed_args": ["--x", 1]}
    ids = {p.id for p in parse_spec(base).expand().points}
    assert len(ids) == 2
    for changed in ({"fixed_args": ["--x", 2]}, {"steps": 3}, {"arg_style": "equals"}, {"infer": True}):
        assert not ids & {p.id for p in parse_spec({**base, **changed}).expand().points}, changed
    assert ids == {p.id for p in parse_spec(dict(base)).expand().points}  # the same spec, the same ids
    p = parse_spec({**base, "arg_style": "equals", "steps": 2}).expand().points[0]
    assert isinstance(p, ScriptPoint) and (p.batch_size, p.seq_len) == (0, 0)  # unmapped axes: 0
    cmd = p.command(tmp_path / "runs" / p.id, python="py")
    assert cmd == ["py", "-m", "lmprof", "run", "--no-report", "--out", str(tmp_path / "runs"), "--run-dir",
                   str(tmp_path / "runs" / p.id), "--steps", "2", str(script), "--x", "1", "--lr=0.1"]


def test_script_spec_problems_are_one_line_naming_the_key(tmp_path: Path, cli) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    s = str(script)
    cases = [
        ({"script": str(tmp_path / "nope.py")}, "script: Value error, no such script"),
        ({"script": s, "args": {"batch_size": [1]}}, "args: Value error, 'batch_size': an argument name starts with -"),
        ({"script": s, "args": {"--b": []}}, "args: Value error, --b: must not be empty"),
        ({"script": s, "args": {"--b": [1, "1"]}}, "--b: duplicate value '1'"),
        ({"script": s, "args": {"--b": [1]}, "batch_size_arg": "--bs"}, "batch_size_arg: '--bs' is neither a key of args"),
        ({"script": s, "args": {"--b": ["x"]}, "batch_size_arg": "--b"}, "batch_size_arg: --b must take whole numbers"),
        ({"script": s, "models": ["tiny"]}, "unknown key 'models'"),
        ({"script": s, "args": {"--b": [1]}, "exclude": [{"--c": 1}]}, "exclude: rule 0: unknown key '--c' (rules match on --b)"),
        ({"script": s, "timeout_s": 0}, "timeout_s: Value error, must be positive"),
    ]
    for values, needle in cases:
        with pytest.raises(ConfigError) as err:
            parse_spec(values, where="s.yaml")
        text = str(err.value).replace("Value error, ", "Value error, ")
        assert text.startswith("s.yaml: ") and "\n" not in text, text
        assert needle.replace("Value error, ", "") in text, text
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"script": s, "args": {"b": [1]}}))
    code, _out, err = cli("sweep", bad, "--out", tmp_path / "o")
    assert code == 2 and "args:" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    plan = parse_spec({"script": s, "args": {"--b": [1, 2], "--c": ["x", "y"]}, "exclude": [{"--b": 2, "--c": "Y"}]}).expand()
    assert (len(plan.points), plan.excluded) == (3, 1)  # rules match argument values as text


def test_shipped_script_spec_is_valid() -> None:
    root = Path(__file__).resolve().parents[1]
    spec = root / "docs" / "examples" / "nanogpt_sweep.yaml"
    if not spec.is_file():
        pytest.fail("the example spec is missing")
    import os

    old = os.getcwd()
    os.chdir(root)  # paths in a spec are read from the folder lmprof sweep runs in, as lmprof train's are
    try:
        plan = load_spec(spec).expand()
    finally:
        os.chdir(old)
    assert len(plan.points) == 4 and all(p.batch_size > 0 and p.seq_len > 0 for p in plan.points)
    assert sys.executable  # the points run `python -m lmprof run` with the sweep's own interpreter


def test_a_changed_script_spec_never_merges_into_recorded_points(tmp_path: Path) -> None:
    from lmprof.errors import DataError
    from lmprof.record.store import Store

    script = tmp_path / "t.py"
    script.write_text("")
    base = {"script": str(script), "args": {"--batch_size": [2]}, "fixed_args": ["--lr", "0.1"]}
    first = parse_spec(base).expand().points
    with Store(tmp_path / "results.sqlite") as store:
        store.plan(first, "{}")
        store.mark_running(first[0].id, "runs/x", "now")
        store.finish(first[0].id, "ok", None, "now", 1.0)
        changed = parse_spec({**base, "fixed_args": ["--lr", "0.2"]}).expand().points
        assert changed[0].label == first[0].label and changed[0].id != first[0].id
        with pytest.raises(DataError, match=r"another configuration \(argv: \['--lr', '0\.1'"):
            store.plan(changed, "{}")  # the same label, another configuration: refused, nothing merged
        store.plan(first, "{}")  # the unchanged spec plans the same point again
        assert store.statuses() == {first[0].id: "ok"}


AFTER = """
import argparse, os
import torch
p = argparse.ArgumentParser()
p.add_argument("--then", default="")
p.add_argument("--batch_size", type=int, default=2)
p.add_argument("--block_size", type=int, default=8)
a = p.parse_args()
model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):  # the window (1 warm-up, 1 clean, the profiler's, 1 profiled) completes at step 4
    x = torch.randint(0, 64, (a.batch_size, a.block_size))
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    opt.zero_grad()
if a.then == "killed":
    os.kill(os.getpid(), 9)  # the kernel's OOM killer, a preemption: SIGKILL, nothing runs after it
raise ValueError("the evaluation after training failed")
"""


@pytest.mark.slow
def test_a_script_that_fails_or_is_killed_after_its_measured_window_is_a_whole_point(tmp_path: Path) -> None:
    """A script's run is written as its profiled window completes: what the script does after it (a crash, a
    SIGKILL) no longer makes a point whose measurement is whole an error or an oom that --resume runs again from
    scratch; the message says what came after. Truth: the record is there, whole, read without lmprof."""
    script = tmp_path / "after.py"
    script.write_text(textwrap.dedent(AFTER))
    spec = {"script": str(script), "name": "after", "args": {"--then": ["raise", "killed"]},
            "fixed_args": ["--batch_size", "2", "--block_size", "8"], "batch_size_arg": "--batch_size",
            "seq_len_arg": "--block_size", **FAST}
    path = tmp_path / "after.yaml"
    path.write_text(yaml.safe_dump(spec))
    summary = run_sweep(load_spec(path), tmp_path / "sweep")
    assert summary.counts == {"ok": 2}
    for label, row in _rows(tmp_path / "sweep").items():
        then = "killed by signal 9 (SIGKILL)" if "killed" in label else "ValueError: the evaluation after training failed"
        assert row["status"] == "ok" and then in row["message"], row
        assert row["message"].startswith("measured whole (run.json written as the profiled window completed); then ")
        record = json.loads((tmp_path / "sweep" / row["run_dir"] / "run.json").read_text())
        assert record["metrics"]["step_time"]["n"] == 1 and record["blocks"]


def test_a_worker_still_running_at_the_timeout_after_writing_its_run_is_ok(tmp_path: Path) -> None:
    """The timeout's side of it: a worker (here a stand-in for python that writes run.json, then hangs) killed at
    timeout_s with its record written is ok, the message saying it was stopped."""
    from lmprof.sweep.runner import run_point

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"whole": true}\' > "$4/run.json"\nexec sleep 30\n')  # -m worker POINT RUN_DIR
    fake.chmod(0o755)
    point = ScriptPoint(mode="train", model="after", script=str(tmp_path / "s.py"), argv=[], grid={})
    outcome = run_point(point, tmp_path / "run", timeout_s=0.5, python=str(fake))
    assert outcome.status == "ok", outcome
    assert outcome.message == ("measured whole (run.json written as the profiled window completed); then no result "
                               "after 0.5 s (timeout_s): the worker was killed")
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"whole": True}
