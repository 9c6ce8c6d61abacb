"""Checks of a run.json as published: against docs/run.schema.json with jsonschema (a validator that is
not pydantic), and every table and key of its ``tables`` against docs/run-format.md's paragraphs. Used by
the tests that write real records (train, infer, compiled, watched, torchrun)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "docs" / "run.schema.json"


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def assert_valid(run_json: Path) -> None:
    """``run_json`` matches the published schema (every problem listed, not the first)."""
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator().iter_errors(json.loads(run_json.read_text(encoding="utf-8")))]
    assert not errors, errors


def table_docs() -> dict[str, str]:
    """docs/run-format.md's paragraph on each of run.json's tables, by the table's name."""
    doc = (ROOT / "docs" / "run-format.md").read_text(encoding="utf-8")
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    return {p[len("`tables."):p.index("`", 1)]: p for p in paragraphs if p.startswith("`tables.")}


def keys_of(rows: list[Any]) -> set[str]:
    """Every key of a table's rows, and of the objects inside them (``event_cost_us``, ``held``)."""
    found: set[str] = set()
    for row in rows:
        for key, value in row.items() if isinstance(row, dict) else ():
            found.add(key)
            if isinstance(value, dict):
                found |= keys_of([value])
            elif isinstance(value, list):
                found |= keys_of(value)
    return found


def assert_tables_documented(run_json: Path) -> None:
    """Each table of ``run_json`` has its paragraph in docs/run-format.md, which names each of its keys."""
    docs = table_docs()
    tables = json.loads(run_json.read_text(encoding="utf-8"))["tables"]
    missing = [name for name in tables if name not in docs]
    missing += [f"{name}.{key}" for name, rows in tables.items() if name in docs
                for key in sorted(keys_of(rows)) if f"`{key}`" not in docs[name]]
    assert not missing, f"run.json keys docs/run-format.md does not describe: {missing}"
