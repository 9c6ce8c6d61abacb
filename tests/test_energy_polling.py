"""Power integration used by every polling meter."""
from __future__ import annotations

import threading

import pytest

from lmprof.measure.energy.base import MeterError
from lmprof.measure.energy.polling import PowerPoller, integrate


def test_trapezoids_over_the_samples() -> None:
    assert integrate([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)], 0.0, 3.0) == 550.0


def test_edges_are_held_flat_and_clipped_to_the_window() -> None:
    pts = [(1.0, 10.0), (3.0, 30.0)]
    # 0..1 held at 10 W, 1..3 ramps 10 -> 30 W (40 J), 3..4 held at 30 W
    assert integrate(pts, 0.0, 4.0) == 10.0 + 40.0 + 30.0
    # only 2..3 of the ramp: 20 -> 30 W
    assert integrate(pts, 2.0, 3.0) == 25.0


def test_empty_window_and_no_samples() -> None:
    assert integrate([], 5.0, 5.0) == 0.0
    with pytest.raises(ValueError):
        integrate([], 0.0, 1.0)


def test_poller_without_samples_asks_for_a_longer_window() -> None:
    t = [0.0]
    poller = PowerPoller(lambda: 1.0, clock=lambda: t[0], interval_s=0.5, sync_edges=False, threaded=False)
    poller.start()
    t[0] = 0.1
    with pytest.raises(MeterError, match="measure longer"):
        poller.stop()


def test_poller_reports_sampling_errors_from_its_thread() -> None:
    tried = threading.Event()

    def broken() -> float:
        tried.set()
        raise OSError("sensor gone")

    poller = PowerPoller(broken, clock=lambda: 0.0, interval_s=0.001, sync_edges=False)
    poller.start()
    assert tried.wait(5.0)
    with pytest.raises(MeterError, match="sensor gone"):
        poller.stop()
