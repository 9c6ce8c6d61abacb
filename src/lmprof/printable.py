"""Text that can always be printed and written as UTF-8.

A command-line argument or a file name holding bytes that are not UTF-8 reaches Python as a str with
surrogate escapes; printed, written into JSON or into run.json, it fails ("surrogates not allowed").
Shown here with U+FFFD in their place, as a terminal shows such a name.
"""
from __future__ import annotations

import os
from typing import Any

import orjson


def printable(text: str) -> str:
    """``text`` with bytes that are not UTF-8 (surrogate escapes) shown as U+FFFD."""
    return os.fsencode(text).decode("utf-8", "replace") if isinstance(text, str) else str(text)


def _clean(obj: Any) -> Any:
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {_clean(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def json_text(doc: Any) -> str:
    """``doc`` as indented JSON text (orjson); strings that are not valid UTF-8 are made printable."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # orjson refuses surrogates: the document holds a name that is not UTF-8
        return orjson.dumps(_clean(doc), option=orjson.OPT_INDENT_2).decode()
