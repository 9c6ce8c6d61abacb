"""Who steps the loop, and what follows from it: the policy a door hands its session (here the base and
someone else's loop; lmprof's own is own_loop.py).

:class:`Observer` — someone else's loop (``lmprof run``, ``lmprof.profile()``, the Trainer and
Lightning callbacks): lmprof only watches. Its probes place the phase scopes, a hook on the model
sees a generation's forwards, the figures step is the second warm-up step, a failure of lmprof's ends
the session with one line (the user's program goes on), and the session writes the run itself as the
profiled window completes, inside that step (else when it ends: a hook, a signal, the with-block's end).

:class:`OwnLoop` — lmprof's own loop (``lmprof train`` / ``infer``): its step places its own phase
scopes and reports each forward's end, the figures step is one extra untimed warm-up step, the
energy window grows to what the meter needs, lmprof's errors are raised (there is no user program to
protect), and the door assembles the run from the session's :class:`Measured` record.
"""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from lmprof.counts import Counts
from lmprof.hardware.devices import Device
from lmprof.measure.energy import EnergyMonitor
from lmprof.pipeline.protocol.finish.measured import Described, Measured
from lmprof.pipeline.protocol.observed import Known, ModelFacts, Observed
from lmprof.pipeline.protocol.spec import Spec

if TYPE_CHECKING:
    from lmprof.record.run import Run


class Driver:
    """What a session's behaviour depends on; see the module doc for the two kinds."""

    probes_place_phases = True  # False: the step places its own phase scopes (the probes would nest twice)
    hooks_forwards = True  # generations: a hook on the model marks each forward's end (False: the loop does)
    raises = False  # lmprof's own failures: raised (True) or one line, the session ended (False)
    sizes_energy_window = False  # the clean window grows to what the energy meter needs
    known: Known | None = None  # what the loop's owner knows of its workload
    step_means = ""  # what one training step spans, said in step_time's note
    # The step may run models beside the profiled one (a teacher, a reference model): the user's loop may;
    # lmprof's own runs its model alone, and looking for others reads every live object (0.05-0.15 s)
    other_models = True
    # The run is written as the profiled window completes, inside the loop's step (lmprof's own loop
    # stops there and its door writes it): else a script killed after it took the measured window along
    writes_when_complete = False

    def counts(self, asked: Counts) -> Counts:
        """The counts the session runs (the door's, adjusted to the loop)."""
        return asked

    def figures_at(self, warmup: int, compiled: bool) -> int:
        """Which warm-up step is the figures step."""
        return warmup

    def meter(self, device: Device, spec: Spec, notes: list[str]) -> EnergyMonitor | None:
        """The energy meter for the clean window (None: energy off)."""
        return None

    def missing_figure(self, exc: Exception, notes: list[str], what: str) -> None:
        """A figure's instrument failed to start: a note (the figure is n/a), or the error raised."""
        if self.raises:
            raise exc
        notes.append(f"{what} ({type(exc).__name__}: {exc})")

    def describe(self, spec: Spec, counts: Counts, facts: ModelFacts, seen: Observed) -> Described:
        """The driver's account of the run: by default, the owner's validated options as they are."""
        return Described(dict(spec.config), self.step_means, self.known, self.hooks_forwards)

    def finished(self, measured: Measured, watched_on: bool = False) -> "Run | None":
        """The session ended with ``measured``: what the driver does with it (the Run, if it made one);
        ``watched_on``: the window's run, written while the watch goes on watching the loop's steps."""
        return None


class Observer(Driver):
    """Someone else's loop; ``first_step_marks_start``: the first boundary only marks a start (``lmprof
    run``: nothing else tells when the first step began), so it counts as a warm-up step."""

    writes_when_complete = True

    def __init__(self, first_step_marks_start: bool = False):
        self.first_step_marks_start = first_step_marks_start

    def counts(self, asked: Counts) -> Counts:
        if self.first_step_marks_start:
            return asked._replace(warmup=max(asked.warmup, 1))
        return asked

    def figures_at(self, warmup: int, compiled: bool) -> int:
        # the second warm-up step (the optimizer's state exists, and a three-step script reaches it), the
        # only one, or the last for a compiled model (its second call may still compile)
        return warmup if compiled else min(2, warmup)

    def meter(self, device: Device, spec: Spec, notes: list[str]) -> EnergyMonitor | None:
        if spec.energy == "off":
            return None
        try:  # a meter that cannot start is a missing figure (n/a, said in the record), never a failure
            return EnergyMonitor.for_device(device, spec.energy, tdp_w=spec.tdp_w)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"energy: no meter ({type(exc).__name__}: {exc})")
            return None

    step_means = "from one optimizer step's end to the next's, device synchronized"

    def describe(self, spec: Spec, counts: Counts, facts: ModelFacts, seen: Observed) -> Described:
        """What the session saw of the user's code, then the door's own facts (``spec.config``)."""
        cfg: dict[str, Any] = {"source": "user code", "model_name": facts.name, "steps": counts.steps,
                               "warmup": counts.warmup, "profile_steps": counts.profile_steps,
                               "device_resolved": str(seen.device), "compile": seen.compiled}
        if seen.model is not None:
            cfg["dtype"] = facts.dtype
            if facts.model_type:
                cfg["model_type"] = facts.model_type
            if facts.attention_impl:
                cfg["attention"] = facts.attention_impl
        if facts.optimizer:
            cfg["optimizer"] = facts.optimizer
        if seen.input_shape and len(seen.input_shape) == 2:
            cfg["batch_size"], cfg["seq_len"] = seen.input_shape
        cfg.update(spec.config)
        return Described(cfg, self.step_means, None, self.hooks_forwards)

    def finished(self, measured: Measured, watched_on: bool = False) -> "Run | None":
        """Assemble the run and write it: save, report.html, the summary on stderr."""
        from lmprof.pipeline.protocol.finish.assemble import assemble
        from lmprof.pipeline.protocol.finish.write import write

        run = assemble(measured)
        write(run, measured.folder, measured.spec)
        if watched_on:
            # Writing made garbage (the trace read, the figures): collected now, in this pause of the loop, not by a
            # collection a watched step would pay for and be read as a spike. Only then: a full collection costs
            # 0.15-0.3 s in a process with transformers loaded, which a loop nobody watches need not pay.
            gc.collect()
        return run
