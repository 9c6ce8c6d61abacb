"""The trace analyses' result records: frozen ``msgspec.Struct`` classes, and their plain-dict form.

Why not frozen dataclasses: creating one compiles six generated methods, about 1 ms a class on a
two-core machine, and the analyses' 36 result classes cost 38 ms of ``lmprof analyze``'s start-up (a
quarter of its imports). msgspec creates a Struct class in C (0.03 ms) with the same fields, order,
defaults, equality, repr, hashing and immutability.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import msgspec


class Record(msgspec.Struct, frozen=True):
    """Base of the analyses' result records. Subclasses say `frozen=True` again (msgspec inherits it;
    type checkers read it per class)."""


def as_dict(obj: Any) -> Any:
    """``obj`` with every record (and dataclass) in it turned into a dict of its fields, recursively
    (lists, tuples and dicts rebuilt around them), as ``dataclasses.asdict`` does for dataclasses."""
    if isinstance(obj, msgspec.Struct):
        return {name: as_dict(getattr(obj, name)) for name in obj.__struct_fields__}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # the multi-rank results are dataclasses
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [as_dict(v) for v in obj]
    if isinstance(obj, tuple):
        if hasattr(obj, "_fields"):  # a namedtuple keeps its type, as dataclasses.asdict keeps it
            return type(obj)(*(as_dict(v) for v in obj))
        return tuple(as_dict(v) for v in obj)
    if isinstance(obj, dict):
        return {as_dict(k): as_dict(v) for k, v in obj.items()}
    return obj


def is_record(obj: Any) -> bool:
    """An instance of a result record."""
    return isinstance(obj, msgspec.Struct)


def record_items(obj: msgspec.Struct) -> list[tuple[str, Any]]:
    """(field name, value) of a record, in field order."""
    return [(name, getattr(obj, name)) for name in obj.__struct_fields__]
