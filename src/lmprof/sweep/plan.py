"""What every sweep spec expands to, whatever its points are (a model's or a script's): the plan, and
how an ``exclude`` rule matches a point. Both kinds of spec (spec.py, script.py) import it; neither
imports the other's module for it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lmprof.safeyaml import short_repr

P = TypeVar("P", covariant=True)


@dataclass(frozen=True)
class Plan(Generic[P]):
    """An expanded spec: the points to run, how many the rules excluded, rules that matched nothing."""

    points: Sequence[P]
    excluded: int
    unused_rules: list[dict[str, Any]]


def listed(value: object, what: str) -> list[Any]:
    """A spec's list field as given: ``[]`` when left empty; ValueError (``must be`` ``what``) when not a list."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"must be {what}")
    return value


def check_rules(rules: Sequence[object], keys: Collection[str], what: str,
                hint: Callable[[str], str] = lambda key: "") -> None:
    """Every ``exclude`` rule is a non-empty mapping of ``what`` (an axis, an argument): value, on ``keys``;
    ValueError naming the first rule that is not (``hint``: a suggestion for an unknown key)."""
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or not rule:
            raise ValueError(f"rule {i} must be a non-empty mapping of {what}: value, got {short_repr(rule)}")
        unknown = [k for k in rule if k not in keys]
        if unknown:
            raise ValueError(f"rule {i}: unknown key {short_repr(unknown[0], 40)}{hint(str(unknown[0]))} "
                             f"(rules match on {', '.join(keys) or f'nothing: no {what} is swept'})")


def positive_seconds(cls: type, v: float) -> float:
    """A spec's ``timeout_s``: a finite number of seconds above 0 (a field validator of either spec)."""
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"must be positive (a finite number of seconds), got {v}")
    return v


def matches(rule: dict[str, Any], where: dict[str, Any]) -> bool:
    """True when every key of ``rule`` matches the point; a list value matches any of its items."""
    for key, want in rule.items():
        options = want if isinstance(want, list) else [want]
        have = where[key]
        if not any(_same(have, o) for o in options):
            return False
    return True


def _same(have: Any, want: Any) -> bool:
    # YAML gives ints/bools already; strings are compared case-insensitively (`CPU` == `cpu`).
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want or (isinstance(want, str) and want.lower() == str(have).lower())
    if isinstance(have, str) and isinstance(want, str):
        return have.lower() == want.lower()
    return bool(have == want)
