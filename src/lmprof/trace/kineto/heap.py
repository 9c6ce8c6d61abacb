"""How the C heap keeps memory while a large trace is read and analysed (glibc only; elsewhere a no-op).

Loading a 270 MB trace allocates and frees hundreds of MB in blocks of MBs (read buffers, scanned
columns, column blocks, the final columns), and the analyses then allocate as much again. Every page
the heap maps afresh is faulted in and zeroed by the kernel, which cost more than any one analysis.
Two settings decide how much of that is done:

* :func:`tune_for_analyze`, for a process of lmprof's own only (the ``analyze`` console command,
  never a user's process): large blocks come from the heap, freed memory is kept for reuse, and
  every thread allocates from one arena, so what the decoding threads freed is what the analyses
  reuse.
* :func:`after_load`: in any other process (glibc's default heap, one arena per thread) the loader
  gives the memory decoding freed back to the OS, so the analyses' peak is not on top of it.
"""
from __future__ import annotations

import sys

__all__ = ["after_load", "tune_for_analyze"]

_one_arena = False  # tune_for_analyze took effect: the analyses reuse what loading freed


def tune_for_analyze() -> None:
    """Set glibc's heap up for reading and analysing a large trace (``mallopt``); before any thread starts.

    Measured on the 259 MB benchmark trace, load and analysis in one fresh process, eight
    alternations: without the last two settings (and with :func:`after_load` giving memory back)
    0.587 s, 70.8k page faults, 286 MB peak; with them 0.565 s, 53.3k faults, 278 MB. Large blocks
    from the heap, kept after free: 0.465 -> 0.418 s of loading alone (page faults 47k -> 37k).
    """
    global _one_arena
    if sys.platform != "linux":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold, m_arena_max = -1, -2, -3, -8
        libc.mallopt(m_mmap_threshold, 256 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
        libc.mallopt(m_top_pad, 64 << 20)
        _one_arena = bool(libc.mallopt(m_arena_max, 1))
    except (OSError, AttributeError):  # not glibc (musl, ...): its defaults stay
        pass


def after_load() -> None:
    """Return the heap memory decoding freed to the OS (a few ms), unless :func:`tune_for_analyze`
    put every thread on one arena, where the analyses reuse it instead.

    With glibc's default arenas (one per decoding thread), decoding leaves tens of MB of freed
    blocks mapped that the analyses (allocating in the main thread's arena) cannot reuse; giving
    them back lowers the peak resident size by that much (about 12 MiB on the 259 MB benchmark trace).
    """
    if _one_arena or sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to do
        pass
