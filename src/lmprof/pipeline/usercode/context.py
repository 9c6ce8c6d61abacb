"""``lmprof.profile(model)``: a door whose session is stepped by ``prof.step()`` inside the user's own loop."""
from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from lmprof.pipeline.protocol import active, messages
from lmprof.pipeline.protocol.say import say
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.triggers import OptimizerTrigger
from lmprof.pipeline.protocol.windows.watch import watch_of
from lmprof.workloads.hooks import unwrap


class Profile:
    """The context manager :func:`lmprof.profile` returns; call :meth:`step` once per step."""

    def __init__(self, model: torch.nn.Module, spec: Spec):
        self.model = model
        self.session = Session(spec)
        self._used = False
        self._idle = False  # another session measures this process: this one stood aside
        self._calls = 0
        self._watch = watch_of(self.session.windows)  # found once: step() runs in every step of the loop

    def __enter__(self) -> "Profile":
        if self._used:  # a second with-block: a new run (the first one's hooks went with its session)
            self.session = Session(self.session.spec)
            self._watch = watch_of(self.session.windows)
            if self.session.spec.verbose:
                say("lmprof: this lmprof.profile() was used before: this with-block is measured as a new run, "
                    "from warm-up")
        self._used = True
        self._calls = 0  # prof.step() calls in this with-block (the session does not count steps it stood aside for)
        if active.claim(self.session) is not None:
            # lmprof run, a callback or another thread's lmprof.profile() measures this process already: two
            # sessions would measure the same steps twice (and two profilers at once crash kineto); this one
            # stands aside, and the program goes on as it would without it
            self.session.done = True
            self.session.message = ("lmprof.profile() is idle: another lmprof session (lmprof run, a callback, or "
                                    "lmprof.profile() in another thread) already measures this process")
            if self.session.spec.verbose:
                say(f"lmprof: {self.session.message}")
            self._idle = True
            return self
        self._idle = False
        try:
            inner, compiled = unwrap(self.model)
            self.session.attach(inner, compiled=compiled, outer=self.model)
            if compiled:
                self.session.observed.notes.append("torch.compile: the model is compiled, so lmprof placed no hooks in "
                                                   "it: its forward is not split into blocks")
            if self.session.spec.traits.trains:
                OptimizerTrigger(self.session, boundaries=False).install()
        except BaseException:
            active.release(self.session)
            raise
        self.session.begin()
        return self

    def step(self, loss: Any = None) -> None:
        """One step (training) or one generation (``infer=True``) ended; ``loss``: the step's loss, for the
        whole-run watch's series (a device tensor is read once the device is done with it, never waited for)."""
        if loss is not None and self._watch is not None:
            self._watch.report_loss(loss)
        self._calls += 1
        self.session.boundary()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._idle:
            return
        active.release(self.session)
        if not self.session.done:
            reason = "the with-block ended" if exc_type is None else f"the loop raised {exc_type.__name__}"
            self.session.finish(reason)
            if self._calls == 0 and self.session.run is None:
                spec = self.session.spec
                self.session.message = messages.no_step_called(reason, spec.unit, trains=spec.traits.trains)
        if self.session.message and self.session.spec.verbose:
            say(f"lmprof: {self.session.message}")

    @property
    def run(self) -> Any:
        """The Run once written (None before, or when nothing was measured)."""
        return self.session.run

    @property
    def folder(self) -> Path | None:
        return self.session.folder if self.session.run is not None else None

    @property
    def message(self) -> str | None:
        """What happened, when the window did not complete."""
        return self.session.message
