"""Every analytic formula lmprof has, in one torch-free package.

A model description (:mod:`~lmprof.estimate.shape`, built from any Hugging Face config by
:mod:`~lmprof.estimate.models` or from the built-in GPT's config) plus a phase, a dtype plan and a
parallel plan give parameters (total and active), FLOPs and bytes per block
(:mod:`~lmprof.estimate.flops`), roofline placement (:mod:`~lmprof.estimate.roofline`), model FLOPs
and MFU metrics of a run (:mod:`~lmprof.estimate.mfu`), the memory budget
(:mod:`~lmprof.estimate.memory`) and the fit check with sharding (:mod:`~lmprof.estimate.fit`).

Nothing here imports torch or any lmprof layer above it (an import-linter contract in
pyproject.toml holds that); callers in ``workloads``, ``measure``, ``analysis``, ``pipeline`` and
``cli`` import from here. The public names below are also reachable as ``lmprof.estimate.<name>``,
loaded on first use so that importing one module does not load the others.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelShape": "shape",
    "shape_from_config": "models",
    "resolve_model": "models",
    "block_costs": "flops",
    "phase_costs": "flops",
    "conventions_for": "flops",
    "FlopConventions": "flops",
    "model_flops_per_step": "flops",
    "mfu_metrics": "mfu",
    "fill_block_costs": "mfu",
    "block_roofline": "mfu",
    "estimate_memory": "memory",
    "memory_metrics": "memory",
    "memory_table": "memory",
    "kv_cache_bytes": "memory",
    "estimate_plan": "fit",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"lmprof.estimate.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_EXPORTS)
