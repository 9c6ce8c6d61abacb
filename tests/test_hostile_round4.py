"""Round 4's hostile inputs (issue 49, items 10 and 13): each is one clear line (exit 2 in the CLI), never
a traceback, and no input is dropped without a word. docs/reliability.md ("Round 4") names the root
cause and the fix of each.

The truths are built by hand here: nesting counted level by level, the byte a store holds in a number
column, the line a duplicate YAML key is on.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import torch

from conftest import one_line_error
from lmprof.errors import ConfigError, DataError
from lmprof.record.store import DB_NAME
from sweep_fakes import _run, fake_sweep


def nested(depth: int, inner: str = "1") -> str:
    """A JSON array nested ``depth`` levels deep, written level by level."""
    return "[" * depth + inner + "]" * depth


# == JSON nested beyond reason ==========================================================================

def test_json_nesting_is_bounded_by_counting_levels():
    from lmprof import safejson

    assert safejson.loads(nested(safejson.MAX_DEPTH)) is not None  # exactly the limit is read
    with pytest.raises(safejson.JSONError, match="nested deeper than 100 levels"):
        safejson.loads(nested(safejson.MAX_DEPTH + 1))
    with pytest.raises(safejson.JSONError, match="nested deeper"):
        safejson.loads(nested(100_000))  # orjson's own limit, then Python's: never a RecursionError
    with pytest.raises(safejson.JSONError, match="nested deeper"):
        safejson.loads('{"spread": NaN, "x": ' + nested(100_000) + "}")  # NaN sends it to Python's parser
    # what Python's json writes and orjson refuses is still read (a calibration's infinite spread)
    assert safejson.loads('{"spread": Infinity, "n": NaN}')["spread"] == float("inf")
    with pytest.raises(safejson.JSONError, match="not a valid JSON document"):
        safejson.loads(b"{\"a\": \xff}")


@pytest.fixture
def deep_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 64, "rope_scaling": ' + nested(100_000) + "}")
    return path


@pytest.mark.parametrize("verb", ["memory", "roofline", "train"])
def test_a_config_json_nested_100000_deep_is_one_line(cli, deep_config, verb):
    args = {"memory": ["memory", "--model", deep_config],
            "roofline": ["roofline", "--model", deep_config, "--device", "cpu"],
            "train": ["train", "--hf-config", deep_config, "--device", "cpu", "--no-report", "--out",
                      deep_config.parent / "runs"]}[verb]
    code, _, err = cli(*args)
    one_line_error(code, err, "nested deeper than 100 levels", str(deep_config))


def test_a_calibration_cache_nested_100000_deep_is_ignored_with_a_note(tmp_path):
    from lmprof.hardware.calibrate import cache_path, resolve_peak

    cache_path("Some CPU", "cpu", tmp_path).write_text('{"schema": "lmprof.calibration/1", "x": ' + nested(100_000) + "}")
    peak = resolve_peak("Some CPU", "cpu", "fp32", directory=tmp_path, threads=1)
    assert peak.flops_per_s is None and "nested deeper than 100 levels" in peak.note


def test_a_run_record_nested_100000_deep_is_one_line(cli, tmp_path):
    good, deep = tmp_path / "good", tmp_path / "deep"
    _run("a", "train", "tiny", 2, 32).save(good)
    deep.mkdir()
    text = (good / "run.json").read_text()
    (deep / "run.json").write_text(text.replace('"tables": {', '"tables": {"x": ' + nested(100_000) + ", ", 1))
    code, _, err = cli("compare", good, deep, "--no-trace")
    one_line_error(code, err, "nested deeper", "run.json")


# == a sweep store with text where numbers belong =======================================================

@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_sweep(tmp_path_factory.mktemp("store"))


@pytest.mark.parametrize("table,column,value", [("metrics", "value", "fast"), ("points", "batch_size", "eight"),
                                                 ("blocks", "time_ms", "slow"), ("points", "config", "not json")])
@pytest.mark.parametrize("verb", ["results", "plots"])
def test_a_store_with_text_in_a_number_column_is_one_line(cli, tmp_path, clean_store, table, column, value, verb):
    import shutil

    folder = tmp_path / "sw"
    shutil.copytree(clean_store, folder)
    with sqlite3.connect(folder / DB_NAME) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = 1", (value,))
    code, _, err = cli(verb, folder)
    line = one_line_error(code, err, f"{table}.{column}", repr(value))
    assert "not a number" in line or "not a JSON object" in line


# == the model given to the Python API ===================================================================

@pytest.mark.parametrize("model", [None, lambda x: x, "gpt2"], ids=["None", "function", "name"])
def test_profile_names_what_it_was_given_instead_of_a_module(tmp_path, model):
    import lmprof

    with pytest.raises(ConfigError, match="needs the model as a torch.nn.Module, got") as info:
        lmprof.profile(model, out=tmp_path)
    assert {None: "got None", "gpt2": "got a str"}.get(model, "got a function") in str(info.value)


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_profile_training_with_no_batches_is_one_line(tmp_path):
    import lmprof

    model, opt = _tiny()
    with pytest.raises(ConfigError, match="batches is empty"):
        lmprof.profile_training(model, [], opt, out_dir=tmp_path / "out", loss_fn=lambda m, b: m(b).sum())


def test_profile_training_with_too_few_batches_is_one_line(tmp_path):
    import lmprof

    model, opt = _tiny()
    two = iter([torch.ones(2, 4), torch.ones(2, 4)])  # an iterator (not cycled) that ends after two
    with pytest.raises(ConfigError, match="batches ran out after 2 batch"):
        lmprof.profile_training(model, two, opt, steps=3, warmup=1, profile_steps=1, out_dir=tmp_path / "out",
                                loss_fn=lambda m, b: m(b).sum())


# == YAML keys given twice ===============================================================================

def test_a_yaml_key_given_twice_is_refused_with_its_line():
    from lmprof.safeyaml import load_text

    text = "name: s\nbatch_sizes: [1, 2]\nseq_lens: [16]\nbatch_sizes: [4]\n"
    with pytest.raises(ConfigError, match=r"spec.yaml: line 4: key 'batch_sizes' given twice \(first on line 2\)"):
        load_text(text, "spec.yaml")
    nested_twice = "models:\n  - name: a\n    n_layer: 1\n    n_layer: 2\n"
    with pytest.raises(ConfigError, match="line 4: key 'n_layer' given twice"):
        load_text(nested_twice, "spec.yaml")
    # a key merged in with << may be overridden: that is what merging is for
    assert load_text("b: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "m")["c"] == {"x": 3, "y": 2}


def test_a_sweep_spec_with_a_key_given_twice_is_one_line(cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: s\nmodels:\n  - preset: tiny\nbatch_sizes: [1, 2]\nseq_lens: [16]\nbatch_sizes: [4]\n")
    code, _, err = cli("sweep", spec, "--out", tmp_path / "out")
    one_line_error(code, err, "line 6: key 'batch_sizes' given twice (first on line 4)")


# == exports ============================================================================================

def test_export_with_a_tracker_package_that_fails_to_import_is_one_line(cli, tmp_path, monkeypatch):
    broken = tmp_path / "site" / "wandb"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('cannot import name x from y (a broken install)')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        monkeypatch.delitem(sys.modules, name)
    _run("a", "train", "tiny", 2, 32).save(tmp_path / "run")
    code, _, err = cli("export", tmp_path / "run", "--to", "wandb", "--dest", tmp_path / "wb")
    one_line_error(code, err, "fails to import", "a broken install")


@pytest.mark.parametrize("dest", ["a-file", "/proc/lmprof-export"])
def test_export_into_a_place_that_cannot_hold_a_folder_is_one_line(cli, tmp_path, dest):
    _run("a", "train", "tiny", 2, 32).save(tmp_path / "run")
    target = tmp_path / dest if dest == "a-file" else Path(dest)
    if dest == "a-file":
        target.write_text("x")
    code, _, err = cli("export", tmp_path / "run", "--to", "tensorboard", "--dest", target)
    one_line_error(code, err, "--dest")


# == lmprof calibrate with a cache it cannot write =========================================================

@pytest.mark.parametrize("where", ["file", "proc", "home-file"])
def test_calibrate_into_a_cache_it_cannot_write_is_one_line_before_measuring(cli, tmp_path, monkeypatch, where):
    import lmprof.hardware.calibrate as cal

    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    if where == "file":
        monkeypatch.setenv("LMPROF_CACHE_DIR", str(a_file))
    elif where == "proc":
        monkeypatch.setenv("LMPROF_CACHE_DIR", "/proc/lmprof")
    else:
        monkeypatch.delenv("LMPROF_CACHE_DIR", raising=False)
        monkeypatch.setenv("HOME", str(a_file))

    def boom(*a, **k):
        raise AssertionError("measured although the cache cannot be written")

    monkeypatch.setattr(cal, "measure_matmul", boom)
    code, _, err = cli("calibrate", "--dtypes", "fp32", "--seconds", "0.2", "--sizes", "32")
    line = one_line_error(code, err, "--no-save")
    assert "file, not a folder" in line or "pseudo-filesystem" in line


def test_store_and_records_keep_their_own_messages_for_plain_junk(tmp_path):
    """The one JSON reader keeps each file's own message: a run.json that is not JSON names the file."""
    from lmprof.record.run import Run

    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(DataError, match="run.json: not a valid JSON document"):
        Run.load(tmp_path)
