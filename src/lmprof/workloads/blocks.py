"""Canonical block names and the scopes that mark them in a profiler trace.

A scope is a ``torch.profiler.record_function`` range named ``lmprof:<block>``. Scopes are off unless
:func:`scopes_enabled` is active, so the clean timing phase pays nothing for them.

:func:`scope_hook` lets a test or benchmark wrap every scope (on or off) with its own context
manager: the stopwatch that is attribution's independent truth (tests/block_stopwatch.py) times
each block during the clean steps and can add known work inside one.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from lmprof.names import SCOPE_PREFIX

_enabled = False
# Scopes inside the model can be kept off while step-part scopes are on: under torch.compile a
# flag that changes between phases would force a recompilation in the profiled phase.
_model_enabled = True

#: hook(kind, name, inner) -> the context manager entered instead of ``inner``, the scope lmprof would
#: have entered (a range or a no-op), which it must enter itself; kind is "block" (:func:`scope`) or
#: "step" (:func:`step_scope`).
ScopeHook = Callable[[str, str, contextlib.AbstractContextManager[object]], contextlib.AbstractContextManager[object]]
_hook: ScopeHook | None = None


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


@contextlib.contextmanager
def scope_hook(hook: ScopeHook | None) -> Iterator[None]:
    """Wrap every scope entered within the ``with`` body by ``hook`` (see :data:`ScopeHook`).

    For tests and benchmarks (a stopwatch per block, known work added inside one); without a hook a
    scope pays one more global read. ``None`` suspends any hook in the body: lmprof's measurement of
    what a scope costs (measure/profiler_cost.py) times the bare scope. Not for compiled models: the
    hook would be traced into the graph.
    """
    global _hook
    before, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = before


def scopes_on() -> bool:
    """Whether scopes emit ranges now (the profiled phase), as opposed to clean steps."""
    return _enabled


def model_scopes(on: bool) -> None:
    """Set whether sub-block scopes inside models are ever emitted (off for compiled models)."""
    global _model_enabled
    _model_enabled = on


@contextlib.contextmanager
def model_scopes_kept() -> Iterator[None]:
    """What :func:`model_scopes` is set to in the body (a built-in run's: off for ``--compile``) is put back
    when it ends, however it ends: a process that goes on (a notebook, ``lmprof.profile`` of a model with
    scopes after a compiled ``run_inference``) keeps its blocks. Left off, the next run's sub-blocks
    got no time and no FLOPs (a run's failed ``--compile`` option set it too)."""
    before = _model_enabled
    try:
        yield
    finally:
        model_scopes(before)


def scope(name: str) -> contextlib.AbstractContextManager[object]:
    """A sub-block range ``lmprof:<name>`` inside a model, when scopes are enabled, else a no-op."""
    # _model_enabled is read first: it is constant for a compiled model, so dynamo's guard holds.
    if _model_enabled and _enabled:
        inner: contextlib.AbstractContextManager[object] = torch.profiler.record_function(SCOPE_PREFIX + name)
    else:
        inner = contextlib.nullcontext()
    return inner if _hook is None else _hook("block", name, inner)


def step_scope(name: str) -> contextlib.AbstractContextManager[object]:
    """A step-part range (data, forward, backward, ...) outside the model."""
    inner: contextlib.AbstractContextManager[object] = (
        torch.profiler.record_function(SCOPE_PREFIX + name) if _enabled else contextlib.nullcontext())
    return inner if _hook is None else _hook("step", name, inner)
