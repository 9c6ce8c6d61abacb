"""docs/run.schema.json and the field tables of docs/run-format.md, generated from the record models.

The truth for the schema is an independent validator (jsonschema, not pydantic) reading real run.json
files that lmprof train and infer wrote here, and a watched run's with alerts and captures
(test_watch_wired.py); and the loader (``Run.load``) and the schema agreeing on what they refuse.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

from lmprof.record import schema as gen
from lmprof.record.run import Block, Metric, Run
from lmprof.errors import DataError
from record_checks import ROOT, SCHEMA_FILE, assert_tables_documented, assert_valid, validator


def test_the_checked_in_schema_and_tables_are_the_models_own():
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == gen.run_schema(), (
        "docs/run.schema.json is stale: run `python -m lmprof.record.schema --write`")
    doc = (ROOT / "docs" / "run-format.md").read_text(encoding="utf-8")
    assert gen.render_doc(doc) == doc, "docs/run-format.md is stale: run `python -m lmprof.record.schema --write`"
    assert "run.schema.json" in doc


def test_every_key_of_the_record_has_its_meaning():
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    objects = {"run.json": schema, **schema["$defs"]}
    missing = [f"{where}.{key}" for where, obj in objects.items() for key, prop in obj["properties"].items()
               if len(prop.get("description", "")) < 8]
    assert not missing
    # each model the record holds has its table in the docs (the generator refuses a marker of anything else)
    doc = (ROOT / "docs" / "run-format.md").read_text(encoding="utf-8")
    assert {f"<!-- fields: {name} " for name in schema["$defs"]} | {"<!-- fields: Run "} <= {
        line[:line.index(" (") + 1] for line in doc.splitlines() if line.startswith("<!-- fields:")}


def test_runs_lmprof_writes_match_the_schema_and_the_docs(cli, tmp_path: Path):
    """A training run with estimated energy and an inference run: valid, every table and key documented,
    and the energy table there at all (the protocol's finish had dropped it: the report's Meters table
    never showed), its one domain as the estimate's formula gives it: rated watts x window."""
    counts = ("--warmup", "1", "--steps", "2", "--profile-steps", "1", "--device", "cpu", "--no-report")
    code, _, err = cli("train", "--batch-size", "2", "--seq-len", "16", "--energy", "estimate", "--tdp-w", "10",
                       *counts, "--out", tmp_path / "t")
    assert code == 0, err
    code, _, err = cli("infer", "--batch-size", "1", "--prompt-len", "8", "--new-tokens", "3", *counts,
                       "--out", tmp_path / "i")
    assert code == 0, err
    written = sorted(tmp_path.glob("*/*/run.json"))
    assert len(written) == 2
    for path in written:
        assert_valid(path)
        assert_tables_documented(path)
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["blocks"] and record["metrics"] and "watch" not in record
        # every figure that carries a basis is one the field's meaning names
        based = {k for k, m in record["metrics"].items() if m.get("basis") is not None}
        assert based and {k for k in based if f"`{k}`" not in Metric.model_fields["basis"].description} == set()
    train = json.loads(written[1].read_text(encoding="utf-8"))
    assert train["mode"] == "train"
    assert {"attribution", "memory", "memory_measured", "energy"} <= set(train["tables"])  # roofline: a known peak
    (cpu,) = train["tables"]["energy"]
    assert (cpu["meter"], cpu["method"], cpu["source"], cpu["watts"]) == ("estimate", "model", "estimated", 10.0)
    assert cpu["joules"] == pytest.approx(10.0 * cpu["seconds"], rel=1e-9) and cpu["idle_w"] == pytest.approx(2.0)
    assert train["metrics"]["energy.estimated.total"]["value"] == pytest.approx(cpu["joules"], rel=1e-9)
    assert "generation" in json.loads(written[0].read_text(encoding="utf-8"))["tables"]


def test_the_schema_refuses_what_the_loader_refuses(tmp_path: Path):
    record = Run(id="x", mode="train", created="2026-11-30T00:00:00Z", config={},
                 env={"device": "cpu", "device_name": "cpu", "torch": "2", "python": "3", "lmprof": "0", "os": "L",
                      "cpu": "c", "threads": 1, "cpu_count": 2},  # an extra env key: allowed by both
                 metrics={"step_time": Metric(value=1.0, unit="ms", source="measured")},
                 blocks=[Block(name="ln_1", phase="forward", time_ms=1.0, profiled_ms=1.0, pct=100.0)])
    folder = record.save(tmp_path / "ok")
    assert_valid(folder / "run.json")
    good = json.loads((folder / "run.json").read_text(encoding="utf-8"))

    def spoilt(change: Any) -> dict[str, Any]:
        data = json.loads(json.dumps(good))
        change(data)
        return data

    bad = [
        spoilt(lambda d: d.update(blcoks=[])),  # a misspelt key
        spoilt(lambda d: d["blocks"][0].update(time_ms="fast")),  # a figure that is not a number
        spoilt(lambda d: d["metrics"]["step_time"].update(source="guessed")),  # not measured/estimated/derived
        spoilt(lambda d: d["metrics"]["step_time"].pop("unit")),  # a figure without its unit
        spoilt(lambda d: d.update(mode="serve")),
    ]
    v = validator()
    for i, data in enumerate(bad):
        assert not v.is_valid(data), i
        path = tmp_path / f"bad{i}" / "run.json"
        path.parent.mkdir()
        path.write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(DataError):
            Run.load(path)


@pytest.mark.parametrize(("annotation", "words"), [
    (str, "string"), (int, "int"), (float | None, "number or null"), (Literal["a", "b"], "`a` \\| `b`"),
    (list[Block], "list of **Block**"), (dict[str, Metric], "object: name -> **Metric**"), (dict[str, Any], "object"),
    (list[dict[str, Any]], "list of object"), (Literal["clean"] | None, "`clean` or null"),
])
def test_type_words(annotation: Any, words: str):
    assert gen.type_words(annotation) == words


def test_the_command_checks_writes_and_refuses(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "docs").mkdir()
    doc = "# x\n\n<!-- fields: Growth (generated) -->\nold table\n<!-- end fields -->\n\nprose | kept\n"
    (tmp_path / "docs" / "run-format.md").write_text(doc, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert gen.main([]) == 1
    assert "docs/run.schema.json is stale" in capsys.readouterr().err
    assert gen.main(["--write"]) == 0
    assert gen.main([]) == 0
    text = (tmp_path / "docs" / "run-format.md").read_text(encoding="utf-8")
    assert "old table" not in text and "| `beyond_noise` | bool |" in text and text.endswith("prose | kept\n")
    assert json.loads((tmp_path / "docs" / "run.schema.json").read_text(encoding="utf-8")) == gen.run_schema()
    assert gen.main(["--wirte"]) == 2
    (tmp_path / "docs" / "run-format.md").write_text("<!-- fields: Nope (x) -->\n<!-- end fields -->\n")
    capsys.readouterr()
    assert gen.main([]) == 2
    assert "'Nope', which is not a record model" in capsys.readouterr().err
    (tmp_path / "docs" / "run-format.md").write_text("<!-- fields: Block (x) -->\nno end marker\n")
    assert gen.main([]) == 2
    assert "without its '<!-- end fields -->'" in capsys.readouterr().err
    (tmp_path / "docs" / "run-format.md").unlink()
    assert gen.main([]) == 2
    assert capsys.readouterr().err.count("\n") == 1
