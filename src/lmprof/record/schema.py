"""run.json described for readers without lmprof: its JSON Schema and the field tables of docs/run-format.md.

Both are generated from the record models (record/run.py), whose field strings are the meanings, and
the watch's series table from its column table (record/watch.py), so a field is described once and a
new one reaches the schema and the docs by regeneration::

    python -m lmprof.record.schema           exit 1 naming each generated file that is stale
    python -m lmprof.record.schema --write   write docs/run.schema.json and refresh docs/run-format.md

The schema is the shape run.json is written in (pydantic's serialization schema, JSON Schema draft
2020-12): any validator can check a record, and every key carries its meaning as its description.
"""
from __future__ import annotations

import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel

from lmprof.atomic import write_text
from lmprof.errors import DataError
from lmprof.record.run import SCHEMA, Baseline, Block, Env, Growth, Metric, OpStat, Run, WatchAlert, WatchCapture, \
    WatchSection
from lmprof.record.watch import SERIES_COLUMNS

SCHEMA_PATH = Path("docs") / "run.schema.json"
DOC_PATH = Path("docs") / "run-format.md"
# The models docs/run-format.md tables, by the name its markers use (``series``: the watch's Parquet columns).
TABLED: dict[str, type[BaseModel]] = {m.__name__: m for m in (
    Run, Env, Metric, Block, OpStat, WatchSection, Baseline, WatchAlert, WatchCapture, Growth)}
SERIES = "series"
# <!-- fields: Name ... --> table <!-- end fields -->: the table between the two is generated.
_MARKED = re.compile(r"(<!-- fields: (\w+)[^>]*-->\n)(.*?)(<!-- end fields -->)", re.S)


def run_schema() -> dict[str, Any]:
    """The JSON Schema of run.json, as written (keys by their on-disk names)."""
    schema = _tidy(Run.model_json_schema(by_alias=True, mode="serialization"))
    schema["description"] = (f"run.json of an lmprof run folder ({SCHEMA}; docs/run-format.md). Each key's meaning is "
                             "its description.")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"lmprof run record ({SCHEMA})",
            **{k: v for k, v in schema.items() if k != "title"}}


def _tidy(node: Any, *, is_property: bool = False) -> Any:
    """Descriptions on one line (the field strings are wrapped for the code, not for a reader), and
    no titles on properties (pydantic makes them from the key: "Step S Median" says nothing more)."""
    if isinstance(node, list):
        return [_tidy(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and is_property:
            continue
        if key == "description" and isinstance(value, str):
            out[key] = " ".join(value.split())
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _tidy(prop, is_property=True) for name, prop in value.items()}
        else:
            out[key] = _tidy(value)
    return out


def schema_text() -> str:
    """docs/run.schema.json's text."""
    return json.dumps(run_schema(), indent=2, ensure_ascii=False) + "\n"


def type_words(annotation: Any) -> str:
    """A field's type as the docs write it: ``number or null``, ``list of **Block**``, `` `train` \\| `infer` ``."""
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"**{annotation.__name__}**"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(a) for a in args)
    if origin is list:
        return f"list of {type_words(args[0])}"
    if origin is dict:
        return "object" if args[1] is Any else f"object: name -> {type_words(args[1])}"
    return {str: "string", int: "int", float: "number", bool: "bool"}.get(annotation, getattr(annotation, "__name__",
                                                                                            str(annotation)))


def _cell(text: str) -> str:
    """Text for one markdown table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def field_table(model: type[BaseModel]) -> str:
    """The markdown table of a model's fields: key (as on disk), type, meaning (the field's string)."""
    rows = ["| key | type | meaning |", "|---|---|---|"]
    rows += [f"| `{field.alias or name}` | {type_words(field.annotation)} | {_cell(field.description or '')} |"
             for name, field in model.model_fields.items()]
    return "\n".join(rows) + "\n"


def series_table() -> str:
    """The markdown table of the watch's series columns: name, Parquet type, unit, meaning."""
    rows = ["| column | type | unit | meaning |", "|---|---|---|---|"]
    rows += [f"| `{c.name}` | {c.dtype} | {c.unit} | {_cell(c.meaning)} |" for c in SERIES_COLUMNS]
    return "\n".join(rows) + "\n"


def render_doc(text: str) -> str:
    """``text`` (docs/run-format.md) with every marked table generated afresh; an unknown name is an error."""
    def table(m: re.Match[str]) -> str:
        name, model = m.group(2), TABLED.get(m.group(2))
        if model is None and name != SERIES:
            raise DataError(f"{DOC_PATH} marks a table of {name!r}, which is not a record model")
        return m.group(1) + (field_table(model) if model is not None else series_table()) + m.group(4)

    out, found = _MARKED.subn(table, text)
    if found != text.count("<!-- fields:"):
        raise DataError(f"{DOC_PATH} has a '<!-- fields: ... -->' marker without its '<!-- end fields -->'")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Check (exit 1 when stale) or, with ``--write``, write the generated files under the current folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--write"]):
        print("usage: python -m lmprof.record.schema [--write]", file=sys.stderr)
        return 2
    try:
        doc = DOC_PATH.read_text(encoding="utf-8")
        wanted = {SCHEMA_PATH: schema_text(), DOC_PATH: render_doc(doc)}
        current = {SCHEMA_PATH: SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.is_file() else "", DOC_PATH: doc}
    except (OSError, UnicodeDecodeError, DataError) as exc:  # run from elsewhere than the repository, or a bad marker
        print(f"python -m lmprof.record.schema: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, text in wanted.items() if current[path] != text]
    if args:
        for path in stale:
            write_text(path, wanted[path])
            print(f"wrote {path}")
        return 0
    for path in stale:
        print(f"{path} is stale: run `python -m lmprof.record.schema --write`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
