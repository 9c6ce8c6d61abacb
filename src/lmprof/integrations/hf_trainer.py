"""A ``transformers`` Trainer callback that runs lmprof's protocol on the Trainer's own steps.

    trainer = Trainer(..., callbacks=[lmprof.integrations.TrainerCallback(out="runs/")])

A step is one Trainer step (``on_step_end``: after the optimizer step, the scheduler and zero_grad,
all gradient-accumulation micro-batches included). The model is the one the Trainer trains.
"""
from __future__ import annotations

import sys
from typing import Any

import transformers

from lmprof.integrations._callback import SessionCallback
from lmprof.pipeline.protocol import active
from lmprof.workloads.hooks import compiled_wrapper, unwrap


class TrainerCallback(SessionCallback, transformers.TrainerCallback):  # type: ignore[misc]  # transformers is not followed by mypy
    """Profile a Trainer's steps: warm-up, clean timed steps, a profiled window, a run folder.

    The run is written as its window completes, inside that step. ``stop_after=True`` then asks the
    Trainer to stop; otherwise training goes on unprofiled, or with ``watch=True`` watched to its end
    (docs/user-code.md, "Watching the whole run"; the run is written again, with the watch's section,
    when training ends). ``run`` and ``folder`` hold the result afterwards.
    """

    source = "TrainerCallback"

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if active.active_session() is not None:  # lmprof run already watches this process's steps
            print("lmprof: TrainerCallback is idle: lmprof run already profiles this script", file=sys.stderr)
            return
        if model is None:
            return
        opt = kwargs.get("optimizer")
        if getattr(args, "torch_compile", False):
            # The Trainer hands its callbacks the model, but trains accelerate's torch.compile wrapper of it:
            # taken for an eager model, it got lmprof's hooks, and dynamo compiled 6 graphs where it compiles 2.
            wrapper = compiled_wrapper(model)
            model = model if wrapper is None else wrapper
        self.spec.label = type(unwrap(model)[0]).__name__
        self._start(self.spec, model, [opt] if opt is not None else [])  # accelerate wraps the optimizer
        if self.log_to:  # the Trainer's reporting callbacks have opened their runs by now (and end them first)
            from lmprof.trackers import joins

            self._joins = joins.hf_trainer(args)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        s = self.session
        if s is None or s.done:
            return control
        self._step_ended()  # after the profiled window: the watch's, when there is one
        if (s.done or s.collected) and self.stop_after:  # else the run was written as its window completed
            s.finish(None)
            self._release()
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # lmprof's figures join the runs the Trainer's MLflow and TensorBoard callbacks opened.
        self._end_training(getattr(self, "_joins", None))

