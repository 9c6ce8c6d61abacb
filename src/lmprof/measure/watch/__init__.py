"""The whole-run watch's measuring side: the per-step recorder, its device edges, its spill files and the
capture requests from outside the script. The detectors are in lmprof.analysis.watch_detect."""
from __future__ import annotations

from lmprof.measure.watch.device import period_for
from lmprof.measure.watch.recorder import Recorded, Rows, Watcher
from lmprof.measure.watch.requests import CAPTURE_FILE, CaptureRequests

__all__ = ["CAPTURE_FILE", "CaptureRequests", "Recorded", "Rows", "Watcher", "period_for"]
