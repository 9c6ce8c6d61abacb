"""What a window is: a part of the protocol that measures over some steps, started and stopped at
step boundaries, and aborted (keeping nothing) whatever state it is in.

The session tells every window of each step's beginning and end (steps numbered as in
:mod:`lmprof.pipeline.protocol.plan`); a window asks the plan whether the step concerns it. Teardown
is one loop over :meth:`Window.abort`. A window reaches the session only through :class:`Context`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lmprof.hardware.devices import Device
    from lmprof.measure.energy import EnergyMonitor
    from lmprof.measure.other_models import Beside
    from lmprof.measure.profiling import ProfiledPhase
    from lmprof.pipeline.protocol.observed import Observed
    from lmprof.pipeline.protocol.plan import PhasePlan
    from lmprof.pipeline.protocol.probes import Probes
    from lmprof.pipeline.protocol.spec import Spec
    from lmprof.pipeline.protocol.timing import StepClock, Timings


class Policy(Protocol):
    """What a window may ask of the session's driver (driver.py): who owns the loop."""

    probes_place_phases: bool
    sizes_energy_window: bool
    other_models: bool

    def meter(self, device: "Device", spec: "Spec", notes: list[str]) -> "EnergyMonitor | None": ...

    def missing_figure(self, exc: Exception, notes: list[str], what: str) -> None: ...


class Context(Protocol):
    """What a window may use of its session."""

    spec: "Spec"
    observed: "Observed"
    timings: "Timings"
    clock: "StepClock"  # the running step's marks (a window's forward hook marks the step's first forward)
    kineto_ran: bool  # lmprof started a profiler in this process (a forked child must not finalize)
    failed: bool
    done: bool
    pid: int
    raises: bool  # lmprof's own failures go on to the caller (guard.py)

    @property
    def plan(self) -> "PhasePlan": ...

    @property
    def driver(self) -> Policy: ...

    def claim_folder(self) -> Path: ...

    def lengthen(self, steps: int) -> None:
        """Add ``steps`` clean steps (before the clean window began)."""

    def spoil_step(self) -> None:
        """The running step is not what its kind says (a recording inside it was dropped): untimed."""

    def window_complete(self) -> None:
        """The profiled window completed: remove what lmprof placed, finish if asked to stop."""

    def finish(self, reason: str | None) -> Any: ...

    def assemble_capture(self, folder: Path, profile: "ProfiledPhase", step_s: list[float], config: dict[str, Any],
                         per_step: tuple[float | None, float | None, float | None, float | None]) -> Any:
        """A window's own profiled steps as a run folder of their own (the watch's captures): the Run."""

    def fail(self, exc: BaseException) -> None: ...

    def abandon(self) -> None: ...


def beside_of(ctx: Context) -> "Beside | None":
    """The other models a window's recording gives a row of their own, where the driver looks for them (one
    session-wide scan, observed.py: Observed.beside); None where it does not (driver.py: Driver.other_models)."""
    return ctx.observed.beside() if ctx.driver.other_models else None


class Window:
    """Base: every hook does nothing, so a window overrides only the moments it acts on."""

    name = "window"

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @property
    def active(self) -> bool:
        """Whether it is measuring now."""
        return False

    @property
    def steps_after_window(self) -> bool:
        """Whether it wants step boundaries after the profiled window (a whole-run watcher does): the
        session then keeps its triggers until the run ends."""
        return False

    def attached(self) -> None:
        """The session learned its model (``ctx.observed``): before the first step, or in it."""

    def detached(self) -> None:
        """The session's model was taken back before any step was measured (another is attached next): what
        :meth:`attached` set up goes."""

    def step_begins(self, step: int) -> None:
        """Step ``step`` begins (counted: the plan says what it is), before its clock starts."""

    def clock_started(self, step: int) -> None:
        """Step ``step``'s clock runs (what opens here is inside the step's time and range)."""

    def step_ends(self, step: int) -> None:
        """Counted step ``step`` ended (its time is taken already)."""

    def boundary(self) -> None:
        """A step ended, counted or not: what records inside one step stops here, before the session
        asks whether the user's own profiler runs (lmprof's own recording must not count as one)."""

    def forward_end(self, output: Any) -> None:
        """A top-level forward of a generation ended."""

    def probes(self) -> "Probes | None":
        """The scopes it places in the running step, if any (the optimizer hooks reach them)."""
        return None

    def result(self) -> Any:
        """What it measured, for the run: None, or (a window beyond the protocol's five) an object with
        ``add_to(run, folder)`` that puts it into the Run."""
        return None

    def start(self) -> None:
        """Begin measuring."""

    def stop(self) -> None:
        """End measuring and keep what was measured."""

    def abort(self) -> None:
        """End measuring and keep nothing; removes everything it installed. Safe in any state."""
