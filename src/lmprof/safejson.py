"""Reading JSON that a user (or an attacker) wrote: nesting bounded, one line for anything wrong.

Python's own parser recurses once per level of nesting, and so does code that walks what it parsed
(a record saved again, a message quoting it): a config.json or a calibration cache holding
``[[[[...]]]]`` 100,000 deep raised ``RecursionError`` in ``lmprof memory``, ``roofline`` and
``train``. :func:`loads` is the one reading of a user's JSON file: orjson first (a C parser that
refuses more than 1,024 levels by itself, and the fast path for run records), Python's parser where
orjson refuses what Python writes (``NaN``, ``Infinity``: a calibration's spread can be infinite),
then a check, without recursion, that nothing is nested deeper than :data:`MAX_DEPTH` levels.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from lmprof.errors import DataError, LmprofError

#: Levels of nesting (objects and arrays) a document may have. lmprof's own files have at most 6
#: (a run record's tables), a Hugging Face config.json 4; walking code never nears Python's 1,000.
MAX_DEPTH = 100


class JSONError(DataError):
    """A document that is not JSON or is nested too deeply; the message says which, in one line."""


def loads(raw: bytes | str) -> Any:
    """Parse JSON ``raw``; :class:`JSONError` (one line) when it is not JSON or is nested deeper
    than :data:`MAX_DEPTH` levels."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise JSONError(_too_deep()) from None
        data = _python_loads(raw, exc)
    _check_depth(data)
    return data


def load_file(path: str | Path) -> Any:
    """Read and parse a JSON file; an unreadable file is a :class:`JSONError` naming it too."""
    p = Path(path)
    raw = read_user_file(p, "JSON", JSONError)
    try:
        return loads(raw)
    except JSONError as exc:
        raise JSONError(f"{p}: {exc}") from None


def read_user_file(path: Path, kind: str, error: type[LmprofError]) -> bytes:
    """The bytes of a file a user named; a folder or an unreadable file is one ``error`` line."""
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise error(f"{path} is a directory, not a {kind} file") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None


def _python_loads(raw: bytes | str, first: Exception) -> Any:
    """Python's parser, for what only it accepts (NaN, Infinity); its own error when it refuses too."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise JSONError(_too_deep()) from None
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        raise JSONError(f"not a valid JSON document ({' '.join(str(exc).split())[:200]})") from None


def _too_deep() -> str:
    return f"JSON nested deeper than {MAX_DEPTH} levels, more than lmprof reads"


def _check_depth(data: Any) -> None:
    """Refuse ``data`` nested deeper than :data:`MAX_DEPTH`, walking containers without recursion."""
    if not isinstance(data, (dict, list)):
        return
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise JSONError(_too_deep())
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
