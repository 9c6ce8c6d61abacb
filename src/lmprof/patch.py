"""A function or method of someone else's, replaced by lmprof's wrapper while a session needs it.

A session patches four: ``GenerationMixin.generate`` (each call a generation), ``GradScaler.step`` (a step
whose optimizer step it skipped is a step all the same), ``torch.save`` (a step that saves a checkpoint
does known work, not the training step's) and torch's profiler's ``_prepare_trace`` (another profiler
about to start: lmprof's gives way). Each wrapper calls the original; removing it restores the
original only where the attribute still holds lmprof's wrapper: one patched over it (another library,
another session) stays, and lmprof's then passes calls through to what it wrapped.
"""
from __future__ import annotations

import functools
from typing import Any, Callable


class Patch:
    """``owner.name`` replaced by ``wrap(original)`` from :meth:`install` to :meth:`remove`."""

    def __init__(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]):
        self.owner, self.name, self.wrap = owner, name, wrap
        self.original: Any = None

    def install(self) -> None:
        original = getattr(self.owner, self.name)
        setattr(self.owner, self.name, functools.wraps(original)(self.wrap(original)))
        self.original = original

    def remove(self) -> None:
        if self.original is not None:
            if getattr(getattr(self.owner, self.name), "__wrapped__", None) is self.original:
                setattr(self.owner, self.name, self.original)
            self.original = None
