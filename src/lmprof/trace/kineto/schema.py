"""The fields of a Kineto trace event that lmprof reads, written once: here.

Both readers follow this table. The msgspec rule (:mod:`.decode`) builds its structs from it, the
compiled reader's key table (``_keys.h``, included by ``_scan.c``) is generated from it by
:func:`c_header` (``python scripts/gen_scan_keys.py``; ``tests/test_trace_schema.py`` checks that
the file is what this module generates), and the columns and sparse tables (:mod:`.scan`,
:mod:`.columns`) are named after it. A new args field of a kind already read is one line here, then
the header regenerated and the extension rebuilt (``make setup``); a build made from another table
is never used (its :data:`DIGEST` differs, and traces are read by msgspec alone until it is rebuilt).

Kinds of args, each in the order its columns take:

* :data:`ID_ARGS`: integers kept as int64 columns of the events (-1 when absent; text ids and
  out-of-range integers by :func:`.decode.odd_id`'s rule), read by both readers;
* :data:`NUMBER_ARGS`: what CUPTI reports per kernel and copy, float64 (NaN when absent), read by
  both readers for device events;
* :data:`SHAPE_ARGS`: an operator's input shapes and dtypes (``record_shapes``), kept as raw JSON
  text whose distinct values are decoded once (:func:`.decode.parse_shapes`);
* :data:`COMM_ARGS` and :data:`MEMORY_ARGS`: collective parameters and the allocator's
  ``[memory]`` fields, on few events: the compiled reader hands those events' args to msgspec.
"""
from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from lmprof.trace.fields import COMM_COLUMNS, HW_COLUMNS, ID_COLUMNS


class Field(NamedTuple):
    """One JSON key and the name lmprof gives it (a column, a struct attribute)."""

    key: str
    name: str


class EventField(NamedTuple):
    """One top-level key of an event: the types msgspec accepts for it and its value when absent."""

    key: str
    types: Any
    default: Any


# Top-level keys of an event, in the order of the compiled reader's K_* numbers; "args" holds the
# args struct built from the tables below (its types: None here, filled in by decode.py).
EVENT_FIELDS: tuple[EventField, ...] = (
    EventField("ph", str, ""),
    EventField("name", str | int | float | None, ""),
    EventField("cat", str | None, ""),
    EventField("pid", int | str | None, 0),
    EventField("tid", int | str | None, 0),
    EventField("ts", float | str | None, 0.0),
    EventField("dur", float | str | None, 0.0),
    EventField("id", int | str | None, -1),
    EventField("args", None, None),
)
EVENT_KEYS: tuple[str, ...] = tuple(f.key for f in EVENT_FIELDS)


def _named(keys: tuple[str, ...], names: tuple[str, ...]) -> tuple[Field, ...]:
    """Args keys paired, in order, with the table's column names they fill (lmprof.trace.fields)."""
    return tuple(Field(k, n) for k, n in zip(keys, names, strict=True))


# the args keys of the table's id columns, in the order of fields.ID_COLUMNS
ID_ARGS: tuple[Field, ...] = _named((
    "correlation",  # runtime call <-> kernel
    "External id",  # cpu op <-> runtime call
    "Sequence number",  # forward op <-> backward node
    "stream",
    "device",
), ID_COLUMNS)  # fmt: skip
# the args keys of the table's hardware columns, in the order of fields.HW_COLUMNS
NUMBER_ARGS: tuple[Field, ...] = _named((
    "registers per thread",
    "shared memory",
    "blocks per SM",
    "warps per SM",
    "est. achieved occupancy %",
    "bytes",  # a copy's or set's size
), HW_COLUMNS)  # fmt: skip
SHAPE_ARGS: tuple[Field, ...] = (  # the dims first: an operator has shapes when it has them
    Field("Input Dims", "input_dims"),
    Field("Input type", "input_types"),
)
# the args keys of the table's collective columns, in the order of fields.COMM_COLUMNS
COMM_ARGS: tuple[Field, ...] = _named((
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Group size",
    "Process Group Name",
    "Seq",
), COMM_COLUMNS)  # fmt: skip
MEMORY_ARGS: tuple[Field, ...] = (  # in the order of the memory table's columns
    Field("Device Type", "device_type"),
    Field("Device Id", "device_id"),
    Field("Bytes", "mem_bytes"),
    Field("Addr", "addr"),
    Field("Ev Idx", "ev_idx"),
    Field("Total Allocated", "total_allocated"),
    Field("Total Reserved", "total_reserved"),
)

# The args keys the compiled reader knows, in the order of its ARG_KEYS: ids, numbers, shapes.
C_ARGS: tuple[Field, ...] = ID_ARGS + NUMBER_ARGS + SHAPE_ARGS
# Which table the compiled reader was built from: _keys.h carries it, scan.py compares.
DIGEST = hashlib.sha256(repr((EVENT_KEYS, [f.key for f in C_ARGS], len(ID_ARGS), len(NUMBER_ARGS))).encode()
                        ).hexdigest()[:16]
_MAX_KEY = 32  # the compiled reader's lookup table holds keys shorter than this


def c_header() -> str:
    """The text of ``_keys.h``: the compiled reader's key tables, generated from the tables above.

    Args keys are looked up by their length and last byte: raises ValueError when two keys share
    both (or one is too long), since the reader could then not tell them apart."""
    for k in EVENT_KEYS:
        if not 0 < len(k) <= 6:  # the reader compares a key and its quotes as one 8-byte word
            raise ValueError(f"event key {k!r}: the compiled reader takes keys of 1 to 6 bytes")
    seen: dict[tuple[int, str], str] = {}
    for f in C_ARGS:
        slot = (len(f.key.encode()), f.key[-1])
        if not 0 < slot[0] < _MAX_KEY or slot in seen:
            raise ValueError(f"args key {f.key!r}: its length and last byte do not tell it apart ({seen.get(slot)!r})")
        seen[slot] = f.key

    def strings(keys: list[str]) -> str:
        return ", ".join(_c_string(k) for k in keys)

    def lines(keys: list[str]) -> str:
        return ",\n    ".join(_c_string(k) for k in keys)

    enum = ", ".join(f"K_{k.upper()}" for k in EVENT_KEYS)
    return f"""/* Generated from src/lmprof/trace/kineto/schema.py by scripts/gen_scan_keys.py: do not edit.
 * tests/test_trace_schema.py checks that this file is what the schema generates. */
#ifndef LMPROF_SCAN_KEYS_H
#define LMPROF_SCAN_KEYS_H

/* the schema this reader was built from (scan.py uses no build made from another) */
#define SCAN_SCHEMA "{DIGEST}"

/* top-level keys of an event (EVENT_FIELDS), then any other key, then the start of an event */
enum {{ {enum}, K_OTHER, K_START }};
static const char *const KEY_NAMES[K_OTHER] = {{{strings(list(EVENT_KEYS))}}};

/* args keys: ID_ARGS (int64 columns), NUMBER_ARGS (float64 columns), SHAPE_ARGS (raw text) */
#define N_ID_ARGS {len(ID_ARGS)}
#define N_NUMBER_ARGS {len(NUMBER_ARGS)}
#define N_SHAPE_ARGS {len(SHAPE_ARGS)}
#define ARG_NUMBER0 N_ID_ARGS
#define ARG_SHAPE0 (N_ID_ARGS + N_NUMBER_ARGS)
#define N_ARG_KEYS (ARG_SHAPE0 + N_SHAPE_ARGS)
#define MAX_ARG_KEY {_MAX_KEY}
static const char *const ARG_KEYS[N_ARG_KEYS] = {{
    {lines([f.key for f in C_ARGS])}}};

#endif
"""


def _c_string(s: str) -> str:
    """A C string literal of plain printable ASCII (the keys are; anything else is refused)."""
    if not s.isascii() or not s.isprintable() or '"' in s or "\\" in s:
        raise ValueError(f"key {s!r}: only plain ASCII keys go into the C table")
    return f'"{s}"'
