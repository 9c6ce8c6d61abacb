"""The live objects of some types, read off the garbage collector."""
from __future__ import annotations

import gc
from typing import Any


def live_objects(*types: type) -> list[Any]:
    """Every object the collector tracks whose type is one of ``types`` (or a subclass).

    One pass over what the collector tracks: half a million objects in a process that has transformers
    loaded, about 0.09 s. The type, not isinstance(): isinstance() asks an object for its __class__,
    which a weakref.proxy to a dead object answers with ReferenceError, and some lazily deprecated module
    attributes with a warning (torch.distributed.reduce_op).
    """
    wanted = _subclasses(types)  # a set lookup per object: a third faster than issubclass() on each
    return [o for o in gc.get_objects() if type(o) in wanted]


def _subclasses(types: tuple[type, ...]) -> set[type]:
    """``types`` and every class that derives from them now."""
    out: set[type] = set()
    todo = list(types)
    while todo:
        cls = todo.pop()
        if cls not in out:
            out.add(cls)
            todo.extend(type.__subclasses__(cls))
    return out
