"""The event schema is written once (lmprof/trace/kineto/schema.py): the compiled reader's key table
is generated from it, both readers read every field it names, and a reader built from another
table is never used."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmprof.trace.kineto import decode as dec
from lmprof.trace.kineto import scan, schema

HEADER = Path(schema.__file__).with_name("_keys.h")
native = pytest.mark.skipif(scan._scan is None, reason="the C reader is not built (no compiler at install)")


def test_the_header_is_what_the_schema_generates() -> None:
    """`python scripts/gen_scan_keys.py` after a change to the schema; this fails until then."""
    assert HEADER.read_text() == schema.c_header(), "src/lmprof/trace/kineto/_keys.h is stale: run scripts/gen_scan_keys.py"


@native
def test_the_built_reader_was_made_from_this_schema(monkeypatch) -> None:
    assert scan._scan.SCHEMA == schema.DIGEST
    monkeypatch.setattr(schema, "DIGEST", "0" * 16)  # as if the schema had changed since the build
    assert scan._load() is None  # then traces are read by msgspec alone until `make setup`


def test_the_generator_refuses_keys_the_reader_could_not_tell_apart(monkeypatch) -> None:
    # "Input Xyzs" has the length and last byte of "Input Dims": the reader looks args keys up by both
    monkeypatch.setattr(schema, "C_ARGS", schema.C_ARGS + (schema.Field("Input Xyzs", "x"),))
    with pytest.raises(ValueError, match="Input Xyzs"):
        schema.c_header()
    monkeypatch.setattr(schema, "C_ARGS", schema.C_ARGS[:-1] + (schema.Field('q"x', "q"),))
    with pytest.raises(ValueError, match="plain ASCII"):
        schema.c_header()
    monkeypatch.setattr(schema, "EVENT_KEYS", schema.EVENT_KEYS + ("toolong",))
    with pytest.raises(ValueError, match="1 to 6 bytes"):
        schema.c_header()


def test_the_msgspec_structs_have_the_schemas_fields() -> None:
    args = dec.Args.__struct_encode_fields__
    want = schema.ID_ARGS + schema.NUMBER_ARGS + schema.COMM_ARGS + schema.MEMORY_ARGS + schema.SHAPE_ARGS
    assert sorted(args) == sorted(f.key for f in want)
    assert dec._Event.__struct_fields__ == schema.EVENT_KEYS


@native
def test_both_readers_read_every_field_the_schema_names() -> None:
    """An operator and a kernel carrying every args key the compiled reader knows: the id args land in
    their int64 columns, the numbers in the hardware columns and the shapes in the shape table, the
    same by both readers; and the values are the ones written (the truth is this test's JSON)."""
    ids = {f.key: 100 + i for i, f in enumerate(schema.ID_ARGS)}
    numbers = {f.key: 1.5 + i for i, f in enumerate(schema.NUMBER_ARGS)}
    shapes = {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}
    assert [f.key for f in schema.SHAPE_ARGS] == list(shapes)
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
               "args": {**ids, **shapes}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1, "args": numbers}]
    raw = json.dumps(events).encode()
    for ch in (scan.scan_chunk(raw), dec.decode_chunk(raw, exact=True)):
        assert ch is not None
        for f in schema.ID_ARGS:
            assert ch.x[f.name].tolist() == [ids[f.key], -1], f.key
        assert ch.hw_rows.tolist() == [1]
        for f in schema.NUMBER_ARGS:
            assert ch.hw_cols[f.name].tolist() == [numbers[f.key]], f.key
        assert ch.shape_rows.tolist() == [0] and ch.shape_values == [(((2, 3), (3, 4)), ("float", "float"))]
