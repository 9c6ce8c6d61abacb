"""Plots draw names as they are: no matplotlib mathtext in user text.

Model names, labels and paths come from the user; ``cost $5 vs $10`` must not be drawn as math and
``x$\\frac{$y`` must not stop a plot. Every plotting entry point runs under :func:`literal_text`, which
turns matplotlib's mathtext off for the texts made inside it (``text.parse_math``) and leaves the
caller's own settings as they were.
"""
from __future__ import annotations

import functools
from typing import Callable, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def literal_text(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with matplotlib's mathtext off (texts created inside keep it off when saved later)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib  # lazy: matplotlib only when a plot is drawn

        with matplotlib.rc_context({"text.parse_math": False}):
            return fn(*args, **kwargs)

    return wrapper
