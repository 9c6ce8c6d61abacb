"""Device detection and synchronization: the one place that knows CPU, CUDA and MPS apart.

Everything that reads a clock around device work calls :func:`synchronize` first, because CUDA and
MPS launch work asynchronously and a host clock read without it measures only the launch.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import platform
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from lmprof.config import check_device_spec
from lmprof.errors import DeviceError

# Short names users type for a device they do not have at hand (roofline / memory fit checks).
KINDS = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class Device:
    """A resolved torch device plus what lmprof needs to know about it."""

    torch_device: torch.device
    name: str

    @property
    def kind(self) -> str:
        return self.torch_device.type

    def synchronize(self) -> None:
        synchronize(self.torch_device)

    def __str__(self) -> str:
        return str(self.torch_device)


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(spec: str = "auto") -> Device:
    """Turn ``auto``/``cpu``/``cuda``/``cuda:N``/``mps`` into a :class:`Device`, or raise DeviceError.

    ``auto`` picks the best device present: CUDA, then MPS, then CPU.
    """
    spec = check_device_spec(spec)
    if spec == "auto":
        spec = "cuda" if _cuda_available() else "mps" if _mps_available() else "cpu"
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise DeviceError(f"unknown device {spec!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not _cuda_available():
            raise DeviceError("device 'cuda' requested but torch sees no CUDA GPU on this machine")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device cuda:{index} does not exist ({torch.cuda.device_count()} GPU(s) visible)")
        dev = torch.device("cuda", index)
        return Device(dev, torch.cuda.get_device_name(index))
    if dev.type == "mps":
        if not _mps_available():
            raise DeviceError("device 'mps' requested but the Apple MPS backend is not available here")
        return Device(dev, f"{apple_chip()} GPU (MPS)")
    if dev.type == "cpu":
        return Device(torch.device("cpu"), cpu_model())
    raise DeviceError(f"unsupported device type {dev.type!r}: use auto, cpu, cuda or mps")


def synchronize(device: torch.device) -> None:
    """Wait until all queued work on ``device`` has finished (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A zero-argument sync function for ``device``, for timing loops."""
    return lambda: synchronize(device)


def apple_chip() -> str:
    """The Apple chip's name ("Apple M2 Max"), which the peak table matches; a generic name if unknown."""
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2)
        name = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or f"Apple {platform.machine()}"


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo on Linux, else platform."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_driver(nvml: Any = None) -> str | None:
    """The NVIDIA driver's version, as NVML gives it (``nvml``: the ``pynvml`` module, or a stand-in);
    None where NVML cannot say: no NVIDIA driver (a ROCm or CPU machine), or nvidia-ml-py missing."""
    try:
        nv = nvml if nvml is not None else importlib.import_module("pynvml")
        nv.nvmlInit()  # reference-counted: the energy meter's own init and shutdown are not disturbed
    except Exception:  # noqa: BLE001 - any failure to reach NVML means the version is not known
        return None
    try:
        version = nv.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def environment(device: Device) -> dict[str, object]:
    """Facts about the machine for the run record's ``env``."""
    from lmprof.version import __version__

    env: dict[str, object] = {
        "device": str(device),
        "device_name": device.name,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "lmprof": __version__,
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
    }
    if device.kind == "cuda":
        env["cuda"] = torch.version.cuda
        env["driver"] = gpu_driver()
        props = torch.cuda.get_device_properties(device.torch_device)
        env["gpu_memory_bytes"] = int(props.total_memory)
        env["gpu_sm_count"] = int(props.multi_processor_count)
        env["gpu_capability"] = f"{props.major}.{props.minor}"
    return env
