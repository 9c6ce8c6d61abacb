"""lmprof: profile, explain and compare transformer language models in PyTorch.

The public Python API is imported lazily so that ``import lmprof`` stays cheap (no torch import)
for tools that only read run records.
"""
from __future__ import annotations

from typing import Any

from lmprof.version import __version__

__all__ = ["__version__", "profile", "profile_training", "profile_inference", "load_run", "load_results", "summary",
           "integrations"]


def __getattr__(name: str) -> Any:
    if name == "profile":
        from lmprof.api import profile

        return profile
    if name == "integrations":
        import lmprof.integrations as integrations

        return integrations
    if name == "profile_training":
        from lmprof.api import profile_training

        return profile_training
    if name == "profile_inference":
        from lmprof.api import profile_inference

        return profile_inference
    if name == "load_run":
        from lmprof.record.run import Run

        return Run.load
    if name == "load_results":
        from lmprof.record.store import load_results

        return load_results
    if name == "summary":
        from lmprof.show.summary import render_text

        return render_text  # lmprof.summary(run): the terminal summary as plain text
    raise AttributeError(f"module 'lmprof' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names plus the lazily loaded API (``dir(lmprof)``, tab completion in a REPL)."""
    return sorted({n for n in globals() if n.startswith("__")} | set(__all__))
