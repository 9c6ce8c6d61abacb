"""Errors that mean "the user asked for something wrong or impossible".

The CLI turns any :class:`LmprofError` into a one-line message and exit code 2; everything else is a
bug and keeps its traceback.
"""
from __future__ import annotations

import re
import sys


class LmprofError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class ConfigError(LmprofError):
    """An invalid configuration value (shape, preset, batch size, ...)."""


class DeviceError(LmprofError):
    """A requested device that does not exist or cannot be used."""


class DataError(LmprofError):
    """A missing or unreadable input file (data, trace, run folder)."""


class OutOfMemory(LmprofError):
    """A run asked for more memory than the device has; the message says what ran out and what fits."""


class WorkloadError(LmprofError):
    """The model itself fails: its step raised under lmprof and raises again run plainly (no profiler, no hooks)."""


# CUDA/MPS say "out of memory"; PyTorch's CPU allocator says "can't allocate memory"; the OS says ENOMEM.
OOM_TEXT = re.compile(r"out of memory|can'?t allocate memory|cannot allocate memory|\bOOM\b", re.IGNORECASE)


def is_oom(exc: BaseException) -> bool:
    """True for the ways an out-of-memory shows up in Python: MemoryError, torch's OOM, its message."""
    if isinstance(exc, MemoryError):
        return True
    oom_cls = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(exc, oom_cls):
        return True
    return bool(OOM_TEXT.search(str(exc)))


def first_line(exc: BaseException, most: int = 200) -> str:
    """An error's message as one line of at most ``most`` characters, for a one-line refusal: its first
    line; where that line only introduces what follows (it ends in ':', as huggingface_hub's config
    validation errors do), the cause's message or the next line; cut after a sentence when long; the
    type's name when the message is empty."""
    lines = [" ".join(ln.split()) for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":"):
        cause = exc.__cause__
        text = first_line(cause, most) if cause is not None else " ".join(lines[:2])
    if len(text) > most:
        end = text.rfind(". ", 0, most)
        text = text[: end + 1] if end > 0 else text[:most] + "..."
    return text or type(exc).__name__
