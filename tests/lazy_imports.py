"""Optional trackers and frameworks imported by the tests that use them, not when a file is collected.

Every xdist worker collects every test file: mlflow, Lightning, Ray and W&B at module level cost each
worker about 3 s before its first test, though each worker runs only some of their tests.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest


def installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported (found, not imported)."""
    return importlib.util.find_spec(name.split(".")[0]) is not None


def missing(name: str, reason: str) -> pytest.MarkDecorator:
    """A ``pytestmark`` that skips the file when ``name`` is not installed (as importorskip did)."""
    return pytest.mark.skipif(not installed(name), reason=reason)


class Lazy:
    """A module imported on first attribute access: ``mlflow = Lazy("mlflow")``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # pytest's collection looks for its own markers on every module-level name
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)
