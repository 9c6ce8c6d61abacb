"""Ray for one piece of work (a sweep's points, an analysis's rank traces): started when the process has none,
shut down after, and the process's SIGTERM handler left as it was.

``ray.init`` installs its own SIGTERM handler in the driver and leaves it there after ``ray.shutdown``: a
caller's handler (a sweep turns SIGTERM into Ctrl-C, so running points go back to pending; a user's
program its own) was replaced for the rest of the process. The sweep put it back; ``analyze --ray`` did not.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from lmprof.errors import LmprofError


def ray_module(option: str) -> Any:
    """The ``ray`` package, or one clear error naming the ``option`` that asked for it."""
    try:
        import ray
    except ImportError:
        raise LmprofError(f"{option} needs Ray: pip install 'lmprof[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None, init: dict[str, Any], option: str) -> Iterator[Any]:
    """Yields ``ray``, connected: to the running instance if the process has one (left running), else to
    ``address`` (None: a local instance started here), shut down when the body ends however it ends."""
    ray = ray_module(option)
    started_here = not ray.is_initialized()
    on_term = signal.getsignal(signal.SIGTERM) if _main_thread() else None
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False, **init)
        except Exception as exc:  # noqa: BLE001 - any connection problem is the user's to fix
            raise LmprofError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                              f"{str(exc).splitlines()[0]}") from None
        finally:
            _restore(on_term)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()
            _restore(on_term)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restore(handler: Any) -> None:
    if handler is not None and _main_thread():
        signal.signal(signal.SIGTERM, handler)
