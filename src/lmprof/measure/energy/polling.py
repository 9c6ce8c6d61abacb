"""Energy from a power sensor: sample watts in a background thread and integrate over time.

Used where there is no energy counter (NVIDIA GPUs before Volta, macOS powermetrics). The samples
are joined by straight lines (trapezoids) and held flat before the first and after the last sample,
then integrated over exactly the window, so a sample that lands a little outside the window does
not stretch it.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from lmprof.measure.energy.base import Clock, MeterError, WindowClock


def integrate(points: Sequence[tuple[float, float]], start: float, stop: float) -> float:
    """Integral over [start, stop] of the piecewise-linear curve through ``points`` (t, watts).

    Before the first point and after the last the curve is held at that point's value. Returns
    joules when t is in seconds and the values in watts.
    """
    if stop <= start:
        return 0.0
    if not points:
        raise ValueError("no power samples to integrate")
    pts = sorted(points)
    # Hold the end values flat out to the window edges.
    if pts[0][0] > start:
        pts.insert(0, (start, pts[0][1]))
    if pts[-1][0] < stop:
        pts.append((stop, pts[-1][1]))
    total = 0.0
    for (t0, p0), (t1, p1) in zip(pts, pts[1:]):
        lo, hi = max(t0, start), min(t1, stop)
        if hi <= lo:
            continue
        # Value of the segment's line at lo and hi, then one trapezoid.
        slope = (p1 - p0) / (t1 - t0)
        total += 0.5 * ((p0 + slope * (lo - t0)) + (p0 + slope * (hi - t0))) * (hi - lo)
    return total


class PowerPoller:
    """Samples ``read_watts()`` every ``interval_s`` between :meth:`start` and :meth:`stop`.

    ``sync_edges`` takes one sample synchronously at start and at stop (right for cheap reads such
    as NVML); leave it off when one read blocks for a sampling period (powermetrics). With
    ``threaded=False`` no thread runs and the caller drives :meth:`sample` itself (tests, or a loop
    that already ticks).
    """

    def __init__(
        self,
        read_watts: Callable[[], float],
        *,
        clock: Clock,
        interval_s: float,
        sync_edges: bool = True,
        threaded: bool = True,
    ) -> None:
        self._read = read_watts
        self._clock = clock
        self.interval_s = interval_s
        self._sync_edges = sync_edges
        self._threaded = threaded
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._points: list[tuple[float, float]] = []
        self._error: BaseException | None = None
        self._window = WindowClock(clock, "power poller")

    def sample(self) -> None:
        """Read the power once now and keep (time, watts)."""
        watts = float(self._read())
        # Stamp after the read: for a blocking sensor the reading describes the time just past.
        t = self._clock()
        with self._lock:
            self._points.append((t, watts))

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                if self._stop.wait(self.interval_s):
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by stop(), never lost in the thread
            self._error = exc

    def start(self) -> None:
        """Begin a window now."""
        if self._thread is not None:
            raise MeterError("power poller already running")
        self._points = []
        self._error = None
        self._stop.clear()
        self._window.start()
        if self._sync_edges:
            self.sample()
        if self._threaded:
            self._thread = threading.Thread(target=self._loop, name="lmprof-power-poller", daemon=True)
            self._thread.start()

    def stop(self) -> tuple[float, float, int]:
        """End the window: (joules, seconds, samples). Raises MeterError if sampling failed."""
        span = self._window.stop()
        t0, t1 = span.start, span.end
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise MeterError(f"power sampling failed: {self._error}")
        if self._sync_edges:
            self.sample()
            # The edge sample was stamped after t1; the window ends at t1.
        with self._lock:
            points = list(self._points)
        if not points:
            raise MeterError(
                f"no power sample arrived during the {t1 - t0:.3f} s window "
                f"(one sample takes about {self.interval_s:.3f} s): measure longer"
            )
        return integrate(points, t0, t1), t1 - t0, len(points)

    def close(self) -> None:
        """Stop the thread if a window was left open."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
