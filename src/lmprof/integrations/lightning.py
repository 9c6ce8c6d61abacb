"""A Lightning callback that runs lmprof's protocol on the Lightning Trainer's own steps.

    trainer = pl.Trainer(..., callbacks=[lmprof.integrations.LightningCallback(out="runs/")])

The same protocol and run folder as the Hugging Face :class:`~lmprof.integrations.TrainerCallback`:
a step is one optimizer step (``trainer.global_step`` advancing, so gradient-accumulation
micro-batches belong to the step that applies them); the optimizer hooks place the ``optimizer`` scope.

Lightning calls ``training_step``, not the LightningModule's forward, and a ``training_step`` may call
``self(x)`` or a submodule (``self.model(x)``). The model lmprof watches is the outermost module of
the LightningModule that the first optimizer step actually called, found by a global forward
pre-hook during that step (which is then removed); the first step is spent on this, like a warm-up
step, and the protocol's steps count from its end. Works with ``pytorch_lightning`` or the ``lightning`` bundle,
whichever is installed (the callback must derive from the Trainer's own Callback class).
"""
from __future__ import annotations

import sys
from typing import Any

import torch

try:
    from pytorch_lightning import Callback as _LightningBase
except ImportError:  # the `lightning` bundle ships the same Trainer as lightning.pytorch
    from lightning.pytorch import Callback as _LightningBase

from lmprof.integrations._callback import SessionCallback
from lmprof.pipeline.protocol import active


def _loss_of(outputs: Any) -> Any:
    """The loss in what ``training_step`` returned (a tensor, or a mapping with ``loss``), else None."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


class LightningCallback(SessionCallback, _LightningBase):  # type: ignore[misc]  # Lightning is not followed by mypy
    """Profile a Lightning Trainer's steps: warm-up, clean timed steps, a profiled window, a run folder.

    The run is written as its window completes, inside that step. ``stop_after=True`` then asks the
    Trainer to stop; otherwise training goes on unprofiled, or with ``watch=True`` watched to its end
    (docs/user-code.md, "Watching the whole run"; the run is written again, with the watch's section,
    when training ends). ``run`` and ``folder`` hold the result afterwards.
    """

    source = "LightningCallback"
    _last_step = 0
    _finding: Any = None  # the global forward pre-hook while the watched module is looked for
    _called: torch.nn.Module | None = None
    _idle = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if active.active_session() is not None:  # lmprof run already watches this process's steps
            print("lmprof: LightningCallback is idle: lmprof run already profiles this script", file=sys.stderr)
            self._idle = True
            return
        if getattr(pl_module, "_compiler_ctx", None):
            # its training_step is compiled (lightning's from_compiled): a global hook would be traced into it
            # and its removal compile it again; the module itself is watched
            self._last_step = int(trainer.global_step)
            return
        mine = {id(m) for m in pl_module.modules()}

        def first_called(module: torch.nn.Module, args: Any) -> None:
            # A module's pre-hook runs before its children's: the first one seen is the outermost called.
            if self._called is None and id(module) in mine:
                self._called = module

        self._finding = torch.nn.modules.module.register_module_forward_pre_hook(first_called)
        self._last_step = int(trainer.global_step)

    def _begin(self, trainer: Any, pl_module: Any) -> None:
        """After the first optimizer step: watch the module it called, and start the protocol."""
        self._stop_finding()
        try:
            self.spec.label = type(pl_module).__name__
            # LightningOptimizer wraps each optimizer
            # trainer.fit(torch.compile(module)): Lightning compiles the module's training_step in place
            # (lightning's from_compiled), and the model it calls runs inside that compiled code; lmprof's
            # hooks there were traced, and dynamo compiled 7 graphs where it compiles 2
            self._start(self.spec, self._called if self._called is not None else pl_module,
                        list(getattr(trainer, "optimizers", None) or []),
                        compiled=bool(getattr(pl_module, "_compiler_ctx", None)))
        except Exception as exc:  # an lmprof failure must not stop the user's training
            print(f"lmprof: LightningCallback disabled: {exc}", file=sys.stderr)
            self.session = None
            self._idle = True

    def _stop_finding(self) -> None:
        if self._finding is not None:
            self._finding.remove()
            self._finding = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._idle:
            return
        step = int(trainer.global_step)
        if step == self._last_step:  # a gradient-accumulation micro-batch: the optimizer has not stepped
            return
        self._last_step = step
        s = self.session
        if s is None:
            self._begin(trainer, pl_module)
            return
        if s.done:
            return
        self._step_ended(_loss_of(outputs))  # after the profiled window: the watch's, when there is one
        if (s.done or s.collected) and self.stop_after:  # else the run was written as its window completed
            s.finish(None)
            self._release()
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop_finding()
        if self.log_to:  # lmprof's figures join the runs of the Trainer's loggers
            from lmprof.trackers import joins

            self._end_training(joins.lightning(trainer))
        else:
            self._end_training()
