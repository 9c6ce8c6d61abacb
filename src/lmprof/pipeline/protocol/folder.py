"""The run folder a run measures into: claimed before anything is measured, marked until it is whole.

:func:`run_folder` claims a new folder with an exclusive ``mkdir`` (two runs never share one);
:func:`incomplete_until_saved` (lmprof's own loops) marks it ``INCOMPLETE`` while a run measures
into it, and :func:`settle` (a session in someone else's loop, which writes the run into the folder
as the profiled window completes) judges it when the run ends, so a folder holding only a trace is never
mistaken for a finished run: a folder has run.json, or is marked INCOMPLETE with what it holds and
why, or is removed.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from lmprof.atomic import write_failure, write_text
from lmprof.hardware.devices import Device

INCOMPLETE = "INCOMPLETE"
_INTERRUPTED = "this run was interrupted or failed before its record (run.json) was written\n"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run; ``folder`` is what was left (marked incomplete) or None."""

    def __init__(self, folder: Path | None, kept: list[str]):
        super().__init__(str(folder))
        self.folder = folder
        self.kept = kept


def run_folder(out: str | Path, mode: str, label: str, device: Device, batch: int | None = None) -> Path:
    """Claim a new folder under ``out`` (created here, exclusively) and return it.

    The name is time stamp, mode, label, batch size and device (with its index), so parallel runs of
    different configurations differ by name; runs that still collide get ``-2``, ``-3``, ... because
    the folder is created with a plain ``mkdir`` (fails when it exists), never picked and made later:
    two processes can never both believe they own one folder.
    """
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    index = device.torch_device.index if device.torch_device.index is not None else ""
    parts = [stamp, mode, label] + ([f"b{batch}"] if batch is not None else []) + [f"{device.kind}{index}"]
    base = Path(out) / "-".join(parts)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_failure(base.parent, exc) from exc
    path, i = base, 1
    while True:
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            i += 1
            path = base.with_name(f"{base.name}-{i}")
        except OSError as exc:  # read-only, full, name too long: one line, and nothing measured yet
            raise write_failure(path, exc) from exc


@contextlib.contextmanager
def incomplete_until_saved(folder: Path) -> Iterator[None]:
    """Mark ``folder`` INCOMPLETE while a run measures into it; the mark goes when the block ends normally.

    A run interrupted (Ctrl-C, SIGTERM) or failed leaves its folder with the mark, so a folder holding
    only a trace is never mistaken for a finished run; a folder with nothing measured in it is removed.
    An interruption comes out as :class:`RunInterrupted` saying what was kept.
    """
    marker = folder / INCOMPLETE
    write_text(marker, _INTERRUPTED)
    try:
        yield
    except BaseException as exc:
        kept = sorted(p.name for p in folder.iterdir() if p.name != INCOMPLETE) if folder.is_dir() else []
        if not kept:
            with contextlib.suppress(OSError):
                marker.unlink()
                folder.rmdir()
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
            raise RunInterrupted(folder if kept else None, kept) from None
        raise
    marker.unlink(missing_ok=True)


def settle(folder: Path, why: str | None) -> None:
    """The run measured into ``folder`` (claimed by it) has ended: with run.json the mark goes; without
    one the folder is removed when nothing is in it, else marked with ``why`` and what it holds;
    ``why`` None: nothing was measured, and the folder goes with whatever it holds."""
    marker = folder / INCOMPLETE
    if (folder / "run.json").is_file():
        marker.unlink(missing_ok=True)
        return
    kept = sorted(p.name for p in folder.iterdir() if p.name != INCOMPLETE) if folder.is_dir() else []
    if why is None or not kept:
        shutil.rmtree(folder, ignore_errors=True)
        return
    write_text(marker, f"this run ended before its record (run.json) was written: {why}; it holds {', '.join(kept)}\n")


class SessionFolder:
    """A session's run folder: the door's own (``run_dir``, which the door marks while it measures), or
    claimed under ``out`` when first needed and settled by the session when the run ends (:func:`settle`).
    The run is written into it as the profiled window completes, inside that step of the user's loop (a
    script killed afterwards keeps it); nothing before."""

    def __init__(self, out: str | Path, mode: str, label: str, run_dir: Path | None):
        self.out, self.mode, self.label, self.run_dir = out, mode, label, run_dir
        self.path: Path | None = None
        self._claimed = False

    def claim(self, device: Device) -> Path:
        """The folder, made now if it was not."""
        if self.path is None:
            if self.run_dir is not None:
                self.path = self.run_dir
                self.path.mkdir(parents=True, exist_ok=True)
            else:
                self.path = run_folder(self.out, self.mode, self.label, device)
                self._claimed = True
        return self.path

    def settle(self, why: str | None) -> None:
        """A claimed folder has run.json, or is marked INCOMPLETE saying ``why``, or is gone (``why`` None:
        nothing was measured); a disk that refuses even that leaves it as it is."""
        if self._claimed and self.path is not None:
            with contextlib.suppress(OSError):
                settle(self.path, why)
