"""lmprof's own loops (``lmprof train`` / ``infer``) as drivers of the one measurement session.

The protocol (warm-up, figures step, clean window, profiled window, the run's assembly) is
:class:`~lmprof.pipeline.usercode.session.Session`, the same one ``lmprof run``, ``lmprof.profile()``
and the callbacks feed from inside a user's loop. A driver owns its loop, so it adds only what
needs the loop: the duration check before the run, the energy meter's idle baseline, a stopwatch
pass around each block after the profiled window (attribution's check), and the steps themselves.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from lmprof import progress
from lmprof.config import MeasureSpec
from lmprof.hardware.devices import Device
from lmprof.measure.compile_events import CompileWatch
from lmprof.measure.energy import EnergyMonitor
from lmprof.pipeline.usercode.session import Known, Session, SessionSpec
from lmprof.record.run import Run


def driven_session(
    mode: Literal["train", "infer"], spec: MeasureSpec, out_dir: Path, config: dict[str, Any], device: Device,
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], notes: list[str], known: Known,
) -> Session:
    """A session for lmprof's own loop: one more warm-up step than asked (the figures step, untimed)."""
    session = Session(SessionSpec(
        mode=mode, warmup=spec.warmup + 1, steps=spec.steps, profile_steps=spec.profile_steps, run_dir=out_dir,
        report=False, verbose=False, energy=spec.energy, tdp_w=spec.tdp_w, plots=spec.plots, config=config,
        driven=True))
    # Created here, not by attach(): a meter asked for explicitly (--energy on) that cannot start is an error.
    session.monitor = EnergyMonitor.for_device(device, spec.energy, tdp_w=spec.tdp_w, idle_s=spec.idle_s)
    session.attach(model, optimizers, compiled=spec.compile)
    session.device = device
    session.notes.extend(notes)
    session.known = known
    if spec.compile:
        session.watch = CompileWatch.start()
    # Before warm-up: a device stays clocked up for a while after work.
    session.monitor.measure_idle()
    return session


def steps_planned(session: Session) -> int:
    """The steps a driven session takes: warm-up (the figures step included), clean, the profiler's
    warm-up step, profiled (a FLOPs step, where one is taken, makes one more: progress says so)."""
    spec = session.spec
    return (spec.warmup or 0) + (spec.steps or 0) + 1 + (spec.profile_steps or 0)


def drive_steps(session: Session, step: Callable[[], object]) -> None:
    """Run training steps until the session's profiled window is complete."""
    with stopped_on_error(session):
        session.begin()
        done, planned = 0, steps_planned(session)
        while not (session.collected or session.done):
            step()
            session.boundary()
            done += 1
            progress.report("step", done, planned)


@contextlib.contextmanager
def stopped_on_error(session: Session) -> Iterator[None]:
    """A step that raises (or Ctrl-C) ends the session first: its profiler stopped, its hooks removed,
    so a caller that catches the error (the Python API, a sweep) can run again in this process."""
    try:
        yield
    except BaseException:
        session.abandon()
        raise


def close(session: Session, stopwatch: Callable[[], dict[Any, float]]) -> Run:
    """After the profiled window: the stopwatch pass (``stopwatch()``, attribution's check), then the
    session's end; the Run (not yet saved)."""
    with stopped_on_error(session):
        progress.report("timing each block (attribution's check)")
        session.stopwatch = stopwatch()
        progress.report("reading the trace, attributing blocks")
        session.finish(None)
    if session.run is None:  # a driven session raises its failures: this is a protocol bug, said plainly
        raise RuntimeError(f"lmprof's session ended without a run: {session.message}")
    run: Run = session.run
    return run
