"""The windows of the protocol, in the order the session tells them of each step.

A new window is a module here (a :class:`~lmprof.pipeline.protocol.windows.base.Window`), one line in
:func:`windows_for`, and, when a run asks for it, a field of the spec (protocol/spec.py). Its
:meth:`~lmprof.pipeline.protocol.windows.base.Window.result`, when not None, goes into the run through
its own ``add_to(run, folder)`` (finish/assemble.py calls it for every window beyond the six below).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from lmprof.pipeline.protocol.probes import Probes
from lmprof.pipeline.protocol.windows.base import Context, Window
from lmprof.pipeline.protocol.windows.compile import CompileWindow
from lmprof.pipeline.protocol.windows.figures import FiguresWindow
from lmprof.pipeline.protocol.windows.flops import FlopsWindow
from lmprof.pipeline.protocol.windows.meter import MeterWindow
from lmprof.pipeline.protocol.windows.profiled import ProfiledWindow
from lmprof.pipeline.protocol.windows.shapes import ShapesWindow
from lmprof.pipeline.protocol.windows.watch import WatchWindow


@dataclass
class Windows:
    """The session's windows: the protocol's own six, then any others."""

    compile: CompileWindow
    figures: FiguresWindow
    flops: FlopsWindow
    meter: MeterWindow
    profiled: ProfiledWindow
    shapes: ShapesWindow
    more: list[Window] = field(default_factory=list)

    def __iter__(self) -> Iterator[Window]:
        yield from (self.compile, self.figures, self.flops, self.meter, self.profiled, self.shapes, *self.more)

    @contextlib.contextmanager
    def own_work(self) -> Iterator[list[Probes]]:
        """lmprof's own work in a hook inside the user's step: in its own range in each recording probe
        (probes.py: ScopeStack.own), from here to the first scope opened or closed, and again after the
        probes reopen it, until the block ends. Yields the recording probes."""
        recording = self.recording()
        for p in recording:
            p.scopes.own()
        try:
            yield recording
        finally:
            for p in recording:
                p.scopes.end_own()

    def detached(self) -> None:
        """The session's model was taken back before any step was measured: each window's set-up for it goes."""
        for w in self:
            w.detached()

    def recording(self) -> list[Probes]:
        """The probes placing scopes in the running step (the optimizer hooks reach them); none outside
        the windows that record."""
        return [p for p in (w.probes() for w in self) if p is not None]


def windows_for(ctx: Context) -> Windows:
    """The windows of a session (``ctx``): every session runs the six; a spec may ask for more."""
    more: list[Window] = [WatchWindow(ctx, ctx.spec.watch)] if ctx.spec.watch is not None else []
    return Windows(CompileWindow(ctx), FiguresWindow(ctx), FlopsWindow(ctx), MeterWindow(ctx), ProfiledWindow(ctx),
                   ShapesWindow(ctx), more)
