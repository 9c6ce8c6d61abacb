"""NVIDIA GPU board energy through NVML (the library behind nvidia-smi), via ``pynvml``.

Two ways to read, picked at probe time:

* ``counter`` (Volta and newer): ``nvmlDeviceGetTotalEnergyConsumption`` is the board's energy in
  **millijoules** since the driver loaded; a window is the difference of two reads. The driver
  refreshes it every few tens of ms, so short windows quantise.
* ``power-polling`` (older GPUs, or ``force_polling``): ``nvmlDeviceGetPowerUsage`` is the board
  power in **milliwatts**; a background thread samples it and the samples are integrated over
  time. On Ampere and newer that reading is itself a ~1 s average, one more reason the counter
  is preferred wherever it exists.

Both cover the whole board (GPU die, HBM/GDDR, VRMs), not the host. Run
``python -m lmprof.measure.energy.nvml`` on a GPU machine for a 2 s reading.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from lmprof.measure.energy.base import Availability, Clock, EnergyMeter, EnergyWindow, MeterError, WindowClock
from lmprof.measure.energy.polling import PowerPoller

MJ_PER_J = 1000.0  # NVML energy counter unit: millijoules
MW_PER_W = 1000.0  # NVML power unit: milliwatts


def _load_pynvml() -> Any:
    import pynvml  # lazy: importing is cheap, but a missing driver should only cost this meter

    return pynvml


class NvmlMeter(EnergyMeter):
    """Energy of one NVIDIA GPU board.

    ``index`` is the GPU's NVML index, which equals the torch index only when
    ``CUDA_VISIBLE_DEVICES`` is unset and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; pass ``uuid`` (from
    ``torch.cuda.get_device_properties(i).uuid``) to pick the same board torch uses regardless.
    ``nvml`` replaces the ``pynvml`` module (tests pass a fake with the same functions).
    """

    name = "nvml"

    def __init__(
        self,
        index: int = 0,
        *,
        uuid: str | None = None,
        domain: str | None = None,
        nvml: Any = None,
        clock: Clock = time.monotonic,
        poll_interval_s: float = 0.02,
        force_polling: bool = False,
        threaded: bool = True,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.domain = domain or f"gpu:{index}"
        self._nvml = nvml
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        self._force_polling = force_polling
        self._threaded = threaded
        self._handle: Any = None
        self._method = "counter"
        self._initialised = False
        self._poller: PowerPoller | None = None
        self._start_mj: int | None = None
        self._window = WindowClock(clock, "NvmlMeter")
        self.device_name: str | None = None

    # -- probing ----------------------------------------------------------------------------
    @property
    def method(self) -> str:
        return self._method

    @property
    def update_period_s(self) -> float:
        # Counter: refreshed every ~20-100 ms depending on the board; take the slow end so the
        # short-window warning errs on the side of caution. Polling: one sample per interval.
        return 0.1 if self._method == "counter" else self._poll_interval_s

    @property
    def min_window_s(self) -> float:
        if self._method == "counter":
            return 10.0 * self.update_period_s
        # Sensor power is itself averaged over 1/6..1 s by the driver: below ~1 s the window
        # mostly measures what ran before it.
        return max(10.0 * self._poll_interval_s, 1.0)

    def _error_types(self) -> tuple[type[BaseException], ...]:
        err = getattr(self._nvml, "NVMLError", None)
        return (err,) if isinstance(err, type) else (Exception,)

    def _open_handle(self) -> Any:
        nv = self._nvml
        if self.uuid:
            uuid = self.uuid if self.uuid.startswith(("GPU-", "MIG-")) else f"GPU-{self.uuid}"
            try:
                return nv.nvmlDeviceGetHandleByUUID(uuid)
            except self._error_types():
                pass  # e.g. a MIG slice whose UUID NVML spells differently: fall back to the index
        return nv.nvmlDeviceGetHandleByIndex(self.index)

    def probe(self) -> Availability:
        """Open NVML and the GPU; choose counter or polling. Never raises."""
        if self._nvml is None:
            try:
                self._nvml = _load_pynvml()
            except ImportError:
                return Availability(False, "nvidia-ml-py (pynvml) is not installed")
        nv = self._nvml
        errors = self._error_types()
        try:
            if not self._initialised:
                nv.nvmlInit()
                self._initialised = True
        except errors as exc:
            return Availability(False, f"no NVIDIA driver reachable through NVML ({exc})")
        try:
            self._handle = self._open_handle()
        except errors as exc:
            return Availability(False, f"NVML cannot open {self.domain} ({exc})")
        try:
            name = nv.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except errors:
            self.device_name = None
        if not self._force_polling:
            try:
                nv.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                self._method = "counter"
                return Availability(True, "NVML total energy counter")
            except errors:
                pass  # pre-Volta or not exposed (some vGPU/MIG setups): fall back to power
        try:
            nv.nvmlDeviceGetPowerUsage(self._handle)
        except errors as exc:
            return Availability(False, f"{self.domain} reports neither an energy counter nor power ({exc})")
        self._method = "power-polling"
        self._poller = PowerPoller(
            self._read_watts, clock=self._clock, interval_s=self._poll_interval_s, threaded=self._threaded
        )
        return Availability(True, f"NVML power polled every {self._poll_interval_s * 1000:.0f} ms")

    # -- reading ----------------------------------------------------------------------------
    def _read_watts(self) -> float:
        milliwatts: int = self._nvml.nvmlDeviceGetPowerUsage(self._handle)  # NVML reports integer mW
        return milliwatts / MW_PER_W

    def _read_mj(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def begin(self) -> None:
        if self._handle is None:
            raise MeterError("NvmlMeter.begin() before a successful probe()")
        if self._method == "counter":
            self._start_mj = self._read_mj()
            self._window.start()
        else:
            assert self._poller is not None
            self._poller.start()

    def sample(self) -> None:
        """Take one power sample now (polling mode; the thread does this unless ``threaded=False``)."""
        if self._poller is None:
            raise MeterError("sample() is only for the power-polling method")
        self._poller.sample()

    def end(self) -> EnergyWindow:
        if self._method == "counter":
            if self._start_mj is None or not self._window.running:
                raise MeterError("NvmlMeter.end() without begin()")
            end_mj = self._read_mj()
            seconds = self._window.stop().seconds
            start_mj, self._start_mj = self._start_mj, None
            if end_mj < start_mj:
                # The counter only restarts when the driver reloads; the window is lost.
                raise MeterError(f"{self.domain} energy counter went backwards (driver reloaded?)")
            return EnergyWindow(joules=(end_mj - start_mj) / MJ_PER_J, seconds=seconds, method="counter")
        assert self._poller is not None
        joules, seconds, n = self._poller.stop()
        return EnergyWindow(joules=joules, seconds=seconds, method="power-polling", samples=n)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.close()
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._error_types():
                pass


def main(argv: list[str] | None = None) -> int:
    """Print a reading of one GPU over a few seconds of idle (a quick check on a GPU machine)."""
    parser = argparse.ArgumentParser(prog="python -m lmprof.measure.energy.nvml", description=main.__doc__)
    parser.add_argument("--index", type=int, default=0, help="NVML GPU index")
    parser.add_argument("--seconds", type=float, default=2.0, help="window length")
    parser.add_argument("--polling", action="store_true", help="force the power-polling method")
    args = parser.parse_args(argv)
    meter = NvmlMeter(args.index, force_polling=args.polling)
    avail = meter.probe()
    if not avail.ok:
        print(f"gpu:{args.index}: n/a - {avail.reason}")
        meter.close()
        return 1
    try:
        print(f"{meter.domain} ({meter.device_name}): {avail.reason}")
        meter.begin()
        time.sleep(args.seconds)
        win = meter.end()
        watts = win.watts
        print(
            f"{win.joules:.3f} J over {win.seconds:.3f} s = {watts if watts is None else round(watts, 2)} W"
            f" [{win.method}{'' if win.samples is None else f', {win.samples} samples'}]"
        )
    finally:
        meter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
