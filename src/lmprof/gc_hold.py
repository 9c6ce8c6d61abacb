"""Python's cyclic garbage collector, held off while the ``lmprof`` command starts up.

Importing torch, and torch._dynamo (which a torch optimizer pulls in at its first parameter group),
allocates over a million objects; the collector walks the growing heap again and again meanwhile, and
the interpreter walks all of it once more at exit. Held off, then frozen, the same start-up and exit
took 1.8-2.1 s instead of 3.0-3.2 s (``python -c "import torch, torch._dynamo"``, 3 runs each).

Only the console command holds it (:func:`hold`), never ``lmprof.profile()`` or a callback inside
the user's own process. It is released (:func:`release`) before anything is measured and before any
user code runs: what start-up built is frozen (``gc.freeze``: it lives until exit anyway, and the
collector no longer walks it) and collection is on, as in any Python process. Verbs that measure
nothing get it back before their command runs (``lmprof/cli/main.py``); only ``lmprof analyze PATH
--json``, which runs no user code, draws nothing and builds few reference cycles, keeps it held to the
end.
"""
from __future__ import annotations

import gc

_held = False


def hold() -> None:
    """Stop automatic collection until :func:`release` (a no-op if the process had it off already)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release() -> None:
    """Freeze what exists now and turn automatic collection back on, if :func:`hold` turned it off."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def held() -> bool:
    """Whether :func:`hold` has collection off now."""
    return _held
