"""Plots draw names as they are: no matplotlib mathtext in user text, plain-text log axes.

Model names, labels and paths come from the user; ``cost $5 vs $10`` must not be drawn as math and
``x$\\frac{$y`` must not stop a plot. Every plotting entry point runs under :func:`literal_text`, which
turns matplotlib's mathtext off for the texts made inside it (``text.parse_math``) and leaves the
caller's own settings as they were.

matplotlib's own labels of a log axis are mathtext (``$\\mathdefault{10^{13}}$``), which
:func:`literal_text` would draw raw, as every roofline did. :func:`plain_log_ticks` labels such axes
in plain text that needs no mathtext (``10¹³``, ``2×10⁻³``), on the ticks matplotlib chose; so
mathtext stays off for every text of a plot and user text cannot turn it on.
"""
from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Callable, ParamSpec, TypeVar

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axis import Axis

P = ParamSpec("P")
R = TypeVar("R")

_SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")
_MATHDEFAULT = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")
_POWER = re.compile(r"\^\{(-?\d+)\}")


def literal_text(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with matplotlib's mathtext off (texts created inside keep it off when saved later)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib  # lazy: matplotlib only when a plot is drawn

        with matplotlib.rc_context({"text.parse_math": False}):
            return fn(*args, **kwargs)

    return wrapper


def plain_math(label: str) -> str:
    """A log formatter's mathtext label as plain text: ``$\\mathdefault{2\\times10^{-3}}$`` -> ``2×10⁻³``."""
    m = _MATHDEFAULT.match(label)
    if m is None:
        return label
    inner = _POWER.sub(lambda p: p.group(1).translate(_SUPERSCRIPT), m.group(1))
    return inner.replace("\\times", "\u00d7").replace("{", "").replace("}", "")


def plain_log_ticks(*axes: Axis) -> None:
    """Label each log-scaled ``axis`` (``ax.xaxis``, ``ax.yaxis``) in plain text: call after its scale is set."""
    from matplotlib.ticker import Formatter

    class Plain(Formatter):
        """matplotlib's own formatter for the axis, its labels given in plain text."""

        def __init__(self, inner: Formatter) -> None:
            self.inner = inner

        def set_axis(self, axis: Any) -> None:
            super().set_axis(axis)
            self.inner.set_axis(axis)

        def set_locs(self, locs: Any) -> None:
            super().set_locs(locs)
            self.inner.set_locs(locs)

        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_math(str(self.inner(x, pos)))

    for axis in axes:
        axis.set_major_formatter(Plain(axis.get_major_formatter()))
        axis.set_minor_formatter(Plain(axis.get_minor_formatter()))
