"""Reading YAML that a user (or an attacker) wrote: safe types only, and bounded.

``yaml.safe_load`` never runs code, but aliases let a few hundred bytes stand for a billion values
("billion laughs"): the loaded object shares its parts, and anything that walks it (validation, a
repr in a message) expands them. :func:`load_text` measures the expanded size without expanding
(each shared part is counted once per use, memoised by identity) and refuses documents beyond
:data:`MAX_NODES` values, recursive ones and ones nested deeper than the parser can follow.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from lmprof.errors import ConfigError
from lmprof.safejson import read_user_file

MAX_NODES_ENV = "LMPROF_YAML_MAX_NODES"
MAX_NODES = 100_000  # values after alias expansion; a real spec or config has a few hundred
MAX_BYTES = 10 * 2**20


def max_nodes() -> int:
    """The expansion limit: :data:`MAX_NODES`, or ``$LMPROF_YAML_MAX_NODES`` when set to an integer."""
    try:
        return max(1, int(os.environ.get(MAX_NODES_ENV, MAX_NODES)))
    except ValueError:
        return MAX_NODES


def expanded_size(obj: Any) -> int:
    """How many values ``obj`` holds once every alias is expanded (containers and scalars all count).

    Raises ConfigError for a recursive document (a value that contains itself).
    """
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(o: Any) -> int:
        if not isinstance(o, (list, dict)):
            return 1
        key = id(o)
        if key in memo:
            return memo[key]
        if key in active:
            raise ConfigError("recursive YAML (an alias refers to a value that contains it)")
        active.add(key)
        items = list(o.keys()) + list(o.values()) if isinstance(o, dict) else o
        total = 1 + sum(size(x) for x in items)
        active.discard(key)
        memo[key] = total
        return total

    try:
        return size(obj)
    except RecursionError:
        raise ConfigError("YAML nested too deeply") from None


# libyaml's safe loader (same safe constructors, ~10x faster: the peak table is read by every run) where
# PyYAML was built with it, else the pure-Python one.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"line {line}: key {short_repr(key, 60)} given twice (first on line {first}); lmprof "
                         "would keep only the last: remove one")


class _Loader(_SAFE_LOADER):  # type: ignore[misc,valid-type]  # CSafeLoader or SafeLoader, both untyped
    """The safe loader, refusing a mapping that gives one key twice (PyYAML keeps the last silently).
    Keys merged in with ``<<`` may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the constructor says so itself
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise _DuplicateKey(key, line, first)
            seen[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep)
        return mapping


def load_text(text: str, where: str) -> Any:
    """Parse YAML ``text`` (from ``where``, named in errors) with the safe loader, within the limits."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{where}: {len(text):,} characters of YAML, more than the {MAX_BYTES:,} lmprof reads")
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader, libyaml's where it exists
    except _DuplicateKey as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own depth limit (pure Python recurses instead)
            raise ConfigError(f"{where}: YAML nested too deeply") from None
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
    try:
        n = expanded_size(data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    limit = max_nodes()
    if n > limit:
        raise ConfigError(
            f"{where}: YAML expands to {n:,} values (aliases included), more than the limit of {limit:,}; "
            f"set {MAX_NODES_ENV} to raise it")
    return data


def load_file(path: str | Path) -> Any:
    """Read and parse a YAML file; unreadable files and invalid UTF-8 are one ConfigError line."""
    p = Path(path)
    raw = read_user_file(p, "YAML", ConfigError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (invalid byte at offset {exc.start})") from None
    return load_text(text, str(p))


def short_repr(obj: Any, limit: int = 120) -> str:
    """``repr(obj)`` cut to ``limit`` characters without building the whole repr of a huge value."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother = 3, 6, 6, 60, 60
    text = r.repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."
