"""Canonical block names and the scopes that mark them in a profiler trace.

A scope is a ``torch.profiler.record_function`` range named ``lmprof:<block>``. Scopes are off unless
:func:`scopes_enabled` is active, so the clean timing phase pays nothing for them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from lmprof.names import SCOPE_PREFIX

_enabled = False
# Scopes inside the model can be kept off while step-part scopes are on: under torch.compile a
# flag that changes between phases would force a recompilation in the profiled phase.
_model_enabled = True


@contextlib.contextmanager
def scopes_enabled(on: bool = True, model: bool | None = None) -> Iterator[None]:
    """Turn scopes on (for the profiled phase) within the ``with`` body.

    ``model`` sets whether sub-block scopes inside the model are emitted; None leaves the setting
    made by :func:`model_scopes` alone (a compiled model guards on it, so it must not flip).
    """
    global _enabled, _model_enabled
    before = (_enabled, _model_enabled)
    _enabled = on
    if model is not None:
        _model_enabled = model
    try:
        yield
    finally:
        _enabled, _model_enabled = before


def model_scopes(on: bool) -> None:
    """Set whether sub-block scopes inside models are ever emitted (off for compiled models)."""
    global _model_enabled
    _model_enabled = on


def scope(name: str) -> contextlib.AbstractContextManager[object]:
    """A sub-block range ``lmprof:<name>`` inside a model, when scopes are enabled, else a no-op."""
    # _model_enabled is read first: it is constant for a compiled model, so dynamo's guard holds.
    if _model_enabled and _enabled:
        return torch.profiler.record_function(SCOPE_PREFIX + name)
    return contextlib.nullcontext()


def step_scope(name: str) -> contextlib.AbstractContextManager[object]:
    """A step-part range (data, forward, backward, ...) outside the model."""
    if _enabled:
        return torch.profiler.record_function(SCOPE_PREFIX + name)
    return contextlib.nullcontext()
