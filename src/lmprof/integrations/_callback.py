"""What every framework callback shares: its session's end, its release and its results.

The Hugging Face and Lightning callbacks are doors that differ only in how they see the framework's
steps; the session they drive (pipeline/protocol) and what they hand back are the same, so they live
here once.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmprof.pipeline.protocol import active
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.triggers import OptimizerTrigger
from lmprof.pipeline.protocol.windows.watch import watch_of
from lmprof.pipeline.usercode.guard import watch_spec
from lmprof.workloads.hooks import unwrap


class SessionCallback:
    """Mixin before the framework's own Callback class: the callback's arguments and its session, which
    is set once training starts. ``source`` names the callback in run.json's config."""

    source = "callback"
    session: Session | None = None
    log_to: Sequence[str] = ()

    def __init__(self, out: str | Path = "runs", *, steps: int | None = None, warmup: int | None = None,
                 profile_steps: int | None = None, stop_after: bool = False, report: bool = True,
                 verbose: bool = True, log_to: Sequence[str] = (), watch: bool = False,
                 watch_max_captures: int | None = None, watch_min_gap: int | None = None):
        super().__init__()  # the framework's Callback
        # a watch that cannot be had is one ConfigError line when the callback is made
        watching = watch_spec(watch, watch_max_captures, watch_min_gap, infer=False, stop_after=stop_after,
                              flags=False)
        self.spec = Spec(mode="train", warmup=warmup, steps=steps, profile_steps=profile_steps, out=out,
                         report=report, verbose=verbose, config={"source": self.source}, watch=watching)
        self.stop_after = stop_after
        self.log_to = list(log_to)  # trackers the run goes to once training ends (docs/trackers.md)
        self.session = None

    def _step_ended(self, loss: Any = None) -> None:
        """The framework's step ended (the optimizer stepped); ``loss``: the step's, for the watch's series."""
        s = self.session
        assert s is not None
        if loss is not None:
            watch = watch_of(s.windows)
            if watch is not None:
                watch.report_loss(loss)
        s.boundary()

    def _start(self, spec: Spec, model: torch.nn.Module, optimizers: Sequence[Any], compiled: bool = False) -> Session:
        """Watch ``model`` (unwrapped) stepped by ``optimizers`` (unwrapped from the framework's wrappers);
        ``compiled``: the framework runs it inside compiled code of its own."""
        inner, wrapped = unwrap(model)
        compiled = compiled or wrapped
        session = self.session = Session(spec)
        # a compiled model's wrapper: its hooks run outside the compiled code
        session.attach(inner, [getattr(opt, "optimizer", opt) for opt in optimizers], compiled=compiled,
                       outer=model if compiled and model is not inner else None)
        OptimizerTrigger(session, boundaries=False).install()
        active.register(session)
        session.begin()
        return session

    def _end_training(self, joins: Any = None) -> None:
        """The framework's training ended: write what was measured (if the run is not written yet), then
        log the run to the trackers in ``log_to`` — into the runs the user's framework opened
        (``joins``: a :class:`lmprof.trackers.joins.Joins`) or the run a tracker has open."""
        s = self.session
        if s is None:
            return
        if not s.done:
            s.finish("training ended")
        self._release()
        folder = self.folder
        if self.log_to and folder is not None:
            from lmprof.trackers.export import log_quietly
            from lmprof.trackers.joins import Joins

            # A tracker's failure is one line on stderr inside log_quietly: training has ended normally.
            for line in log_quietly(folder, self.log_to, joins=joins or Joins()):
                if s.spec.verbose:
                    print(f"lmprof: logged to {line}", file=sys.stderr)

    def _release(self) -> None:
        s = self.session
        if s is not None and active.release(s):
            if s.message and s.spec.verbose:
                print(f"lmprof: {s.message}", file=sys.stderr)

    @property
    def run(self) -> Any:
        """The run record once written, else None."""
        return self.session.run if self.session else None

    @property
    def folder(self) -> Path | None:
        """The run folder once the run is written, else None."""
        return self.session.folder if self.session and self.session.run is not None else None
