"""lmprof's own loops (``lmprof train`` / ``infer``) as drivers of the one measurement session.

A driver owns its loop, so it adds only what needs the loop: the energy meter's idle baseline before
warm-up, a clean window as long as the meter needs, the steps themselves (:func:`drive_steps`,
:func:`drive_generations`), and a stopwatch pass around each block after the profiled window
(attribution's check, :func:`close`). Its step places its own phase scopes and reports each
forward's end; its failures are raised, the session abandoned first so the process can run again.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from lmprof import progress
from lmprof.config import MeasureSpec
from lmprof.counts import Counts
from lmprof.errors import LmprofError, WorkloadError, first_line, is_oom
from lmprof.hardware.devices import Device
from lmprof.measure.energy import EnergyMonitor
from lmprof.modes import Mode
from lmprof.pipeline.protocol.driver import Driver
from lmprof.pipeline.protocol.finish.assemble import assemble
from lmprof.pipeline.protocol.observed import Known
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.record.run import Run


class OwnLoop(Driver):
    """lmprof's own loop, describing its workload (``known``); ``idle_s``: the meter's idle baseline."""

    probes_place_phases = False
    hooks_forwards = False
    raises = True
    sizes_energy_window = True
    other_models = False

    def __init__(self, known: Known, idle_s: float = 1.0):
        self.known = known
        self.idle_s = idle_s

    def counts(self, asked: Counts) -> Counts:
        return asked._replace(warmup=asked.warmup + 1)  # the figures step: one more warm-up step, untimed

    def meter(self, device: Device, spec: Spec, notes: list[str]) -> EnergyMonitor | None:
        # A meter asked for explicitly (--energy on) that cannot start is an error here; "off" is a
        # monitor too, whose figures say n/a.
        monitor = EnergyMonitor.for_device(device, spec.energy, tdp_w=spec.tdp_w, idle_s=self.idle_s)
        monitor.measure_idle()  # before warm-up: a device stays clocked up for a while after work
        return monitor

    step_means = "one step: data, forward, backward, optimizer, zero_grad, device synchronized"


def own_session(mode: Mode, spec: MeasureSpec, out_dir: Path, config: dict[str, Any], known: Known) -> Session:
    """A session for lmprof's own loop over ``spec``'s counts, into ``out_dir``; it writes nothing itself
    (the door saves the run it assembles)."""
    return Session(Spec(mode=mode, warmup=spec.warmup, steps=spec.steps, profile_steps=spec.profile_steps,
                        run_dir=out_dir, report=False, verbose=False, energy=spec.energy, tdp_w=spec.tdp_w,
                        plots=spec.plots, config=config), OwnLoop(known, idle_s=spec.idle_s))


@contextlib.contextmanager
def stopped_on_error(session: Session) -> Iterator[None]:
    """A step that raises (or Ctrl-C) ends the session first: its profiler stopped, its hooks removed,
    so a caller that catches the error (the Python API, a sweep) can run again in this process."""
    try:
        yield
    except BaseException:
        session.abandon()
        raise


@contextlib.contextmanager
def the_models_own_failures(again: Callable[[], object], what: str) -> Iterator[None]:
    """A failure inside the block that is the model's own becomes one line (:class:`WorkloadError`).

    Whose failure it is, the model's or the measurement's, is asked of the model itself: ``again()`` (one
    plain step or generation: no profiler, the session's hooks removed by then) runs once more. When it
    raises too, the model fails without the measurement (a transformers model that cannot train at this
    sequence length, say), and the user gets that in one line; when it runs, the failure came from the
    measurement and goes on with its traceback. lmprof's own errors, out-of-memory (the CLI names what
    fits) and interrupts pass untouched.
    """
    try:
        yield
    except Exception as exc:
        if isinstance(exc, LmprofError) or is_oom(exc):
            raise
        try:
            again()
        except Exception as plain:  # noqa: BLE001 - any failure of the model's own code
            if is_oom(plain):
                raise exc from None
            raise WorkloadError(f"the model's {what} fails again run plainly, with no profiler or hooks "
                                f"({_said(plain)}): the model or its settings, not the measurement") from exc
        raise


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


def steps_planned(session: Session) -> int:
    """The steps (generations) the session's plan takes to complete its profiled window, for progress
    lines; the plan may grow (a meter's longer clean window), so it is asked at each step."""
    return session.plan.needed


def drive_steps(session: Session, step: Callable[[], object]) -> None:
    """Run training steps until the session's profiled window is complete."""
    with stopped_on_error(session):
        session.begin()
        done = 0
        while not (session.collected or session.done):
            step()
            session.boundary()
            done += 1
            progress.report("step", done, steps_planned(session))


def drive_generations(session: Session, generate: Callable[[Callable[[], None]], Any], prompt: Any) -> Any:
    """Generate until the session's profiled window is complete; ``generate(on_forward)`` calls
    ``on_forward`` as each forward ends. The last generation's result."""
    last, done = None, 0
    with stopped_on_error(session):
        while not (session.collected or session.done):
            session.generation_begin(None, (prompt,))
            last = generate(session.forward_end)
            session.generation_end()
            done += 1
            progress.report("generation", done, steps_planned(session))
    return last


def close(session: Session, stopwatch: Callable[[], dict[Any, float]]) -> Run:
    """After the profiled window: the stopwatch pass (``stopwatch()``, attribution's check), then the
    session's end; the Run assembled from what it measured (not yet saved)."""
    with stopped_on_error(session):
        progress.report("timing each block (attribution's check)")
        times = stopwatch()
        progress.report("reading the trace, attributing blocks")
        measured = session.finish(None)
        if measured is None:  # lmprof's own loop raises its failures: this is a protocol bug, said plainly
            raise RuntimeError(f"lmprof's session ended without a run: {session.message}")
        return assemble(measured, stopwatch=times)
