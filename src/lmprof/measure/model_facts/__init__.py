"""The model describer: parameters, FLOPs, bytes, saved tensors and cache of any transformers causal LM,
read off the model built on the meta device (see :mod:`.describe`)."""
from __future__ import annotations

from lmprof.measure.model_facts.describe import describe, layer_kinds
from lmprof.measure.model_facts.meta import MetaKernels, build_on_meta, transformers_config

__all__ = ["MetaKernels", "build_on_meta", "describe", "layer_kinds", "transformers_config"]
