"""A measured CPU run's memory bandwidth, measured on the fly when no calibration holds one.

MBU and the roofline need a bandwidth ceiling, and a CPU's cannot be read off it (its FLOP/s can be
estimated from /proc/cpuinfo: ``cpu_peak.py``). So when a measured run on CPU (``lmprof train``,
``lmprof infer``, ``lmprof run``, ``lmprof.profile()``) resolves its peak and no calibration of this
host, CPU and thread count is cached, :func:`~lmprof.hardware.resolve.resolve_peak` measures one
here, once: :func:`~lmprof.hardware.ceilings.measure_bandwidth` (the copy ``lmprof calibrate``
times) with a :data:`BUDGET_S` budget, about 0.4 s with the buffers' allocation. Rules:

* Only inside :func:`allowed`, which the run's figures enter after its timed and profiled windows
  (``pipeline/figures.py``): nothing measured can disturb a timing, and the "what if" commands
  (``lmprof roofline``, ``lmprof memory``) never measure; they read a cached check like a calibration.
* A disturbed check is never cached. Copy repeats whose p90/p10 exceeds
  :data:`~lmprof.hardware.calibration.SPREAD_LIMIT` (1.25x, the rule ``lmprof calibrate`` applies)
  are not used either: the figures are n/a with that reason. Steady copies while other processes
  kept the CPUs busy (the CPU-time counters read around the copy, beyond their resolution:
  ``hardware/cpu_load.py``) give a figure that is used for this run only, marked disturbed in its
  source and notes, and not cached, so a later run measures again (a cache of 11.2 GB/s taken on a
  busy machine was used by every later run, where quiet copies give 18.7-20.9 GB/s). A cached check
  that was never judged so (made by an older lmprof) is not used: a run measures again and replaces
  it. The load average is not judged: just after a run it still counts the run's own work.
* A kept check is cached like a calibration (same folder, file and format, keyed by host, CPU and
  threads) with ``quick: true``; ``lmprof calibrate`` overwrites it, and it never overwrites a
  calibration (one for another thread count: the check is used for this run only).
* Never fatal: any error leaves the figures n/a with the reason.
* ``LMPROF_NO_QUICK_CALIBRATION=1`` turns it off (n/a, saying so); so do several ranks on one machine
  (``WORLD_SIZE`` > 1), whose copies would compete.
"""
from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from lmprof.errors import DataError
from lmprof.hardware import calibration, ceilings
from lmprof.units import si

OPT_OUT_ENV = "LMPROF_NO_QUICK_CALIBRATION"
#: Seconds of timed copies (after one warm-up copy): 128 MiB copies at 10-30 GB/s give 10-30 repeats.
BUDGET_S = 0.25
_FIX = "MBU and the roofline need `lmprof calibrate`"

# The checks done within the current allowed() block, by (CPU, threads, cache folder): measured once.
_ALLOWED: ContextVar[dict[tuple[str, int, str], QuickCheck] | None] = ContextVar("lmprof_quick_bandwidth", default=None)


@dataclass(frozen=True)
class QuickCheck:
    """The outcome of one quick check: the kept measurement (None: none) and the sentence for the run's notes."""

    calibration: calibration.Calibration | None
    note: str


@contextmanager
def allowed() -> Iterator[None]:
    """Within this block a CPU peak lacking a bandwidth may measure one (a measured run's figures only)."""
    token = _ALLOWED.set({})
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def opted_out() -> bool:
    """Whether ``LMPROF_NO_QUICK_CALIBRATION`` is set (to anything but empty or 0)."""
    return os.environ.get(OPT_OUT_ENV, "").strip() not in ("", "0")


def measure_if_allowed(device_name: str, threads: int | None, directory: str | Path | None = None) -> QuickCheck | None:
    """The quick check of this machine's CPU for a run with ``threads`` threads; None outside :func:`allowed`."""
    done = _ALLOWED.get()
    if done is None:
        return None
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    key = (device_name, threads, str(directory or calibration.cache_dir()))
    if key not in done:
        done[key] = _check(device_name, threads, directory)
    return done[key]


def _check(device_name: str, threads: int, directory: str | Path | None) -> QuickCheck:
    if opted_out():
        return QuickCheck(None, f"no memory bandwidth known: {OPT_OUT_ENV}=1 turns the quick bandwidth check off; {_FIX}")
    try:
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        ranks = 1
    if ranks > 1:
        return QuickCheck(None, f"no memory bandwidth known: {ranks} ranks share this machine's memory, so no quick "
                                f"bandwidth check (their copies would compete); {_FIX}")
    try:
        import torch

        from lmprof.hardware.devices import cpu_model

        if device_name != cpu_model():  # a record made elsewhere: this machine's bandwidth says nothing of it
            return QuickCheck(None, f"no memory bandwidth known for {device_name!r}, which is not this machine's CPU; "
                                    f"{_FIX} on that machine")
        result, load = ceilings.watched(lambda: ceilings.measure_bandwidth("cpu", budget_s=BUDGET_S), "cpu", threads)
        cal = calibration.Calibration(
            device="cpu", device_name=device_name, hostname=socket.gethostname(),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), torch=torch.__version__,
            threads=threads, seconds=BUDGET_S, cpu_count=os.cpu_count(), bandwidth=result, quick=True,
            load_check=calibration.load_check(load))
        unsteady = calibration.disturbed_reason(cal)  # the copy's spread (no load average was recorded)
        cal.disturbed = calibration.disturbed_reason(cal, load)
    except Exception as exc:  # a convenience must never cost the run it follows
        return QuickCheck(None, f"no memory bandwidth known: the quick bandwidth check failed "
                                f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); {_FIX}")
    if unsteady:
        return QuickCheck(None, f"no memory bandwidth known: the quick bandwidth check was disturbed ({unsteady}), so "
                                f"it was not kept; {_FIX} on an idle machine")
    figure = f"bandwidth {si(result['bytes_per_s'], 'B/s')} from this run's quick copy check"
    if cal.disturbed:
        return QuickCheck(cal, f"{figure}, DISTURBED ({cal.disturbed}): likely understated (MBU overstated), used for "
                               f"this run only and not cached, so a later run measures again; {_FIX} on an idle machine")
    return QuickCheck(cal, f"{figure}, {_save(cal, directory)}")


def _save(cal: calibration.Calibration, directory: str | Path | None) -> str:
    """Cache ``cal`` unless a calibration is there; says where it went or why not."""
    path = calibration.cache_path(cal.device_name, cal.device, directory, cal.hostname)
    if path.exists():
        try:
            kept: calibration.Calibration | None = calibration.read_calibration(path)
        except DataError:
            kept = None
        if kept is None or not kept.quick:
            what = "a file it cannot read" if kept is None else f"a calibration for {kept.threads} thread(s)"
            return f"not cached: {path} holds {what}, which only `lmprof calibrate` replaces"
    try:
        calibration.save_calibration(cal, directory)
    except Exception as exc:  # an unwritable cache costs the next run 0.3 s, not this run its figures
        return f"not cached ({' '.join(str(exc).split())[:160]})"
    return f"cached in {cal.path}"
