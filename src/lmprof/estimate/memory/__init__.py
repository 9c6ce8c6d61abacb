"""Where every byte goes, from the model's shape alone: the analytic memory breakdown.

Training holds, at its peak, the parameters, their gradients, the optimizer state and the tensors
the forward pass saved for the backward pass (activations). Inference holds the parameters, the KV
cache and one layer's temporaries at a time. Every figure here is in bytes and ``estimated``.

The activation itemization follows Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (arXiv:2205.05198, section 4.1), which counts, per layer at 16-bit,
``s*b*h*(34 + 5*a*s/h)`` bytes: attention ``11sbh + 5as^2b``, MLP ``19sbh``, two layer norms
``4sbh``. Derived for lmprof's GPT (see docs/memory.md for the walk-through):

* with ``dropout == 0`` (the default) nothing keeps a dropout mask, and the softmax output is the
  same tensor the attention-over-values matmul saves: ``16`` tensors of ``sbh`` elements per layer
  plus one ``a*s^2*b`` score tensor;
* element sizes follow the precision regime (fp32; autocast with fp32 parameters, where the residual
  stream, layer norms and log-softmax stay fp32; or 16-bit parameters);
* fused attention (``sdpa``) keeps q, k, v, its output and a log-sum-exp instead of the scores;
* the tensors the paper leaves out but PyTorch keeps are listed too: layer-norm statistics, the
  causal mask, autocast's 16-bit weight copies and the (b, s, V) logits while they live.

The package splits that job by part: ``result`` (the dataclasses and constants), ``params`` (parameter
and buffer counts), ``step`` (the training step's settings the activation formulas read),
``activations`` (the built-in GPT's saved tensors) and ``hf_activations`` (the
Hugging Face families'), ``train`` and ``infer`` (the two modes' moments), ``estimate`` (the entry
point and its checks), ``fits`` (the largest batch under a budget) and ``report`` (run-record metrics,
the memory table, byte formatting); ``lora`` (LoRA/QLoRA plans: adapter counts, NF4 bytes),
``parallel`` (tensor/sequence/pipeline degrees, the activation split of Korthikanti et al.'s section
4.2) and ``share`` (what one device holds under those plans). Every public name is re-exported here, so callers import from
``lmprof.estimate.memory`` as before.
"""
from __future__ import annotations

from lmprof.estimate.memory.result import (
    ATTENTIONS,
    Attention,
    BOOL,
    DTYPE_BYTES,
    EstimateOptimizer,
    FP32,
    INT64,
    MemoryEstimate,
    MemoryItem,
    Optimizer,
    OptimizerImpl,
)
from lmprof.modes import MODES, Mode
from lmprof.estimate.memory.params import causal_mask_bytes
from lmprof.estimate.memory.lora import LORA_TARGETS, Lora
from lmprof.estimate.memory.parallel import Parallel
from lmprof.estimate.memory.hf_activations import (
    HF_GPT2_LAYOUT,
    HF_ITEMIZED,
    HF_LLAMA_LAYOUT,
    HF_OTHER_LAYOUTS,
)
from lmprof.estimate.memory.activations import activation_items
from lmprof.estimate.memory.step import TrainStep
from lmprof.estimate.memory.infer import kv_cache_bytes
from lmprof.estimate.memory.estimate import estimate_memory
from lmprof.estimate.memory.fits import largest_fitting_batch
from lmprof.estimate.memory.report import format_bytes, memory_metrics, memory_table, parts_of

__all__ = [
    "ATTENTIONS",
    "Attention",
    "BOOL",
    "DTYPE_BYTES",
    "EstimateOptimizer",
    "FP32",
    "HF_GPT2_LAYOUT",
    "HF_ITEMIZED",
    "HF_LLAMA_LAYOUT",
    "HF_OTHER_LAYOUTS",
    "INT64",
    "LORA_TARGETS",
    "Lora",
    "MODES",
    "MemoryEstimate",
    "MemoryItem",
    "Mode",
    "Optimizer",
    "OptimizerImpl",
    "Parallel",
    "TrainStep",
    "activation_items",
    "causal_mask_bytes",
    "estimate_memory",
    "format_bytes",
    "kv_cache_bytes",
    "largest_fitting_batch",
    "memory_metrics",
    "parts_of",
    "memory_table",
]
