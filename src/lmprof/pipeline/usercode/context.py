"""``lmprof.profile(model)``: a door whose session is stepped by ``prof.step()`` inside the user's own loop."""
from __future__ import annotations

import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from lmprof.pipeline.protocol import active
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.triggers import OptimizerTrigger, unwrap
from lmprof.pipeline.protocol.windows.watch import watch_of


class Profile:
    """The context manager :func:`lmprof.profile` returns; call :meth:`step` once per step."""

    def __init__(self, model: torch.nn.Module, spec: Spec):
        self.model = model
        self.session = Session(spec)
        self._used = False

    def __enter__(self) -> "Profile":
        if active.active_session() is not None:
            from lmprof.errors import ConfigError

            raise ConfigError("an lmprof session is already running in this process (lmprof run?): "
                              "lmprof.profile() inside it would measure the same steps twice")
        if self._used:  # a second with-block: a new run (the first one's hooks went with its session)
            self.session = Session(self.session.spec)
            if self.session.spec.verbose:
                print("lmprof: this lmprof.profile() was used before: this with-block is measured as a new run, "
                      "from warm-up", file=sys.stderr)
        self._used = True
        inner, compiled = unwrap(self.model)
        self.session.attach(inner, compiled=compiled)
        if compiled:
            self.session.observed.notes.append("torch.compile: the model is compiled, so lmprof placed no hooks in it: "
                                      "its forward is not split into blocks")
        if self.session.spec.mode == "train":
            OptimizerTrigger(self.session, boundaries=False).install()
        active.register(self.session)
        self.session.begin()
        return self

    def step(self, loss: Any = None) -> None:
        """One step (training) or one generation (``infer=True``) ended; ``loss``: the step's loss, for the
        whole-run watch's series (a device tensor is read once the device is done with it, never waited for)."""
        if loss is not None:
            watch = watch_of(self.session.windows)
            if watch is not None:
                watch.report_loss(loss)
        self.session.boundary()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        active.release(self.session)
        if not self.session.done:
            reason = "the with-block ended" if exc_type is None else f"the loop raised {exc_type.__name__}"
            self.session.finish(reason)
        if self.session.message and self.session.spec.verbose:
            print(f"lmprof: {self.session.message}", file=sys.stderr)

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
