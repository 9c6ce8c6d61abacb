"""Apple silicon SoC power through ``powermetrics`` (macOS), integrated over the window.

``powermetrics`` needs root. lmprof never asks for a password: it runs ``powermetrics`` directly
when already root, otherwise only through ``sudo -n`` (which fails at once instead of prompting),
and every call has a timeout. Each sample is a separate ``powermetrics -n 1`` run, so nothing
long-lived runs as root and nothing has to be killed across a privilege boundary.

What it reads: "Combined Power (CPU + GPU + ANE)" in **milliwatts**, averaged by powermetrics over
each sample interval. Apple documents these figures as model-based and approximate; lmprof
labels them measured (they come from the OS, not from lmprof's own formula) and says so in a note.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

from lmprof.measure.energy.base import Availability, Clock, EnergyMeter, EnergyWindow, MeterError
from lmprof.measure.energy.polling import PowerPoller

_COMBINED = re.compile(r"Combined Power \(CPU \+ GPU(?: \+ ANE)?\):\s*([\d.]+)\s*mW")
_PART = re.compile(r"^(CPU|GPU|ANE) Power:\s*([\d.]+)\s*mW", re.MULTILINE)
NOTE = "powermetrics SoC power (Apple's on-chip power model; approximate)"


def parse_powermetrics(text: str) -> float:
    """Watts from one powermetrics sample's text: the combined figure, else CPU+GPU+ANE."""
    m = _COMBINED.search(text)
    if m:
        return float(m.group(1)) / 1000.0
    parts = _PART.findall(text)
    if not parts:
        raise MeterError("powermetrics printed no CPU/GPU power lines (not Apple silicon?)")
    return sum(float(v) for _, v in parts) / 1000.0


class PowermetricsMeter(EnergyMeter):
    """Energy of the Apple SoC (CPU + GPU + ANE) from repeated one-shot powermetrics samples.

    ``run`` (``subprocess.run``), ``platform``, ``which`` and ``geteuid`` are the boundaries tests
    replace; ``threaded=False`` lets a test drive :meth:`sample` itself.
    """

    name = "powermetrics"
    domain = "soc-0"

    def __init__(
        self,
        *,
        interval_ms: int = 200,
        timeout_s: float = 3.0,
        run: Callable[..., Any] = subprocess.run,
        platform: str = sys.platform,
        which: Callable[[str], str | None] = shutil.which,
        geteuid: Callable[[], int] | None = None,
        clock: Clock = time.monotonic,
        threaded: bool = True,
    ) -> None:
        self.interval_ms = interval_ms
        self._timeout_s = timeout_s
        self._run = run
        self._platform = platform
        self._which = which
        self._geteuid = geteuid if geteuid is not None else getattr(os, "geteuid", lambda: -1)
        self._command: list[str] | None = None
        self._poller = PowerPoller(
            self._read_watts, clock=clock, interval_s=0.0, sync_edges=False, threaded=threaded
        )

    @property
    def method(self) -> str:
        return "power-polling"

    @property
    def update_period_s(self) -> float:
        return self.interval_ms / 1000.0

    def _sample_command(self) -> list[str]:
        assert self._command is not None
        return [*self._command, "-n", "1", "-i", str(self.interval_ms), "--samplers", "cpu_power,gpu_power"]

    def _run_sample(self) -> Any:
        try:
            return self._run(
                self._sample_command(),
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=self.interval_ms / 1000.0 + self._timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise MeterError(f"powermetrics gave no sample within {self._timeout_s:g} s") from None

    def _read_watts(self) -> float:
        done = self._run_sample()
        if done.returncode != 0:
            raise MeterError(f"powermetrics failed: {(done.stderr or '').strip()[:200]}")
        return parse_powermetrics(done.stdout)

    def probe(self) -> Availability:
        """Check macOS, the tool, and root without prompting; take one sample to be sure."""
        if self._platform != "darwin":
            return Availability(False, "powermetrics is macOS-only")
        tool = self._which("powermetrics")
        if tool is None:
            return Availability(False, "powermetrics not found on PATH")
        self._command = [tool] if self._geteuid() == 0 else ["sudo", "-n", tool]
        try:
            done = self._run_sample()
            if done.returncode != 0 and self._command[0] == "sudo":
                self._command = None
                return Availability(
                    False,
                    "powermetrics needs root and sudo would ask for a password (lmprof never prompts): "
                    "run lmprof with sudo, or allow powermetrics without a password (NOPASSWD) in sudoers",
                )
            if done.returncode != 0:
                raise MeterError(f"powermetrics failed: {(done.stderr or '').strip()[:200]}")
            parse_powermetrics(done.stdout)
        except MeterError as exc:
            self._command = None
            return Availability(False, str(exc))
        except OSError as exc:
            self._command = None
            return Availability(False, f"cannot run powermetrics: {exc}")
        return Availability(True, f"powermetrics every {self.interval_ms} ms")

    def begin(self) -> None:
        if self._command is None:
            raise MeterError("PowermetricsMeter.begin() before a successful probe()")
        self._poller.start()

    def sample(self) -> None:
        """Take one sample now (the thread does this unless ``threaded=False``)."""
        self._poller.sample()

    def end(self) -> EnergyWindow:
        joules, seconds, n = self._poller.stop()
        return EnergyWindow(joules=joules, seconds=seconds, method="power-polling", samples=n, note=NOTE)

    def close(self) -> None:
        self._poller.close()
