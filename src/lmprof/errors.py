"""Errors that mean "the user asked for something wrong or impossible".

The CLI turns any :class:`LmprofError` into a one-line message and exit code 2; everything else is a
bug and keeps its traceback.
"""
from __future__ import annotations


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
