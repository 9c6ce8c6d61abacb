"""Will it fit: one estimate per GPU with sharding, 8-bit optimizers, quantised weights, a KV dtype.

Builds on :func:`lmprof.estimate.memory.estimate_memory` (one unsharded process) and
rescales its categories moment by moment:

* ``optimizer="adamw8bit"``: two 1-byte moments per parameter plus one fp32 scale per block of
  2,048 values each (bitsandbytes' blockwise 8-bit Adam), instead of two fp32 moments;
* ``shard`` over ``gpus``: ``ddp`` replicates everything; ``zero1`` splits the optimizer state,
  ``zero2`` the gradients too, ``zero3`` / ``fsdp`` the parameters too, and then every GPU also holds
  one layer's gathered parameters (and, in training, their gradients) while it runs;
* inference ``weights`` int8 / int4: matmul weights at ``weight_bytes_per_param`` (a 2-byte scale per
  128 weights), norms and embeddings at the compute dtype; ``kv_dtype`` sets the cache's width.

``usable`` device memory minus a margin is the budget (:func:`fit_budget`). Every figure is bytes,
estimated.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Literal

from lmprof.config import choice
from lmprof.dtypes import dtype_bytes, normalize_weight_dtype, weight_bytes_per_param
from lmprof.errors import ConfigError
from lmprof.estimate.memory import (
    EstimateOptimizer, MemoryEstimate, Optimizer, estimate_memory, kv_cache_bytes,
)
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.memory.from_facts import check_modelled
from lmprof.estimate.memory.lora import Lora
from lmprof.estimate.memory.parallel import Parallel
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.dropout import Dropout
from lmprof.modes import Mode, traits

Shard = Literal["ddp", "zero1", "zero2", "zero3", "fsdp"]
SHARDS: tuple[Shard, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OPTIMIZERS: tuple[EstimateOptimizer, ...] = ("adamw", "adamw8bit", "sgd")
GIB = 1024**3
# Reserved out of the usable memory: the CUDA context and library workspaces (cuBLAS, NCCL) take
# 0.3-1 GiB outside PyTorch's allocator, and the caching allocator loses a few percent to
# fragmentation. A choice, not a measurement: see docs/memory.md.
MARGIN_FIXED = 1 * GIB
MARGIN_FRACTION = 0.02
MAX_GPUS = 2**20  # beyond any cluster; larger counts only make the per-GPU shares meaningless
BNB_BLOCK = 2048  # values per fp32 absmax scale in bitsandbytes' blockwise 8-bit optimizers


def fit_budget(usable: int, margin_fixed: int = MARGIN_FIXED, margin_fraction: float = MARGIN_FRACTION) -> int:
    """Bytes the estimate may use on a device with ``usable`` bytes: usable - fixed - fraction x usable."""
    return max(0, int(usable - margin_fixed - margin_fraction * usable))


def estimate_plan(
    shape: ModelShape | ModelFacts,
    *,
    batch: int,
    seq_len: int,
    mode: Mode = "train",
    dtype: str = "bf16",
    param_dtype: str = "fp32",
    optimizer: str = "adamw",
    attention: Literal["math", "sdpa"] = "sdpa",
    device_kind: str = "cuda",
    new_tokens: int = 0,
    gpus: int = 1,
    shard: Shard = "ddp",
    weights: str | None = None,
    kv_dtype: str | None = None,
    dropout: float | Dropout = 0.0,
    hold_logits: bool = False,
    checkpointing: bool = False,
    lora: Lora | None = None,
    parallel: Parallel | None = None,
) -> MemoryEstimate:
    """The per-GPU memory estimate of one configuration (see the module docstring).

    ``checkpointing`` (train): full activation checkpointing keeps only each layer's input (the
    residual stream) through the forward pass, and one layer's activations at a time while that
    layer's forward is re-run in backward. Estimated, not validated against a measured step.
    ``lora`` and ``parallel`` (tensor/pipeline degrees) give one device's figures; ``gpus`` is then
    the data-parallel degree the ZeRO/FSDP ``shard`` splits over (``gpus x tp x pp`` devices in all).

    ``shape`` may be the describer's :class:`~lmprof.estimate.facts.ModelFacts` of a family the formulas
    do not know (read in ``param_dtype`` = ``dtype``): sharding, 8-bit AdamW, weight formats and the KV
    dtype apply as above; LoRA, tensor/pipeline parallelism and checkpointing are not modelled for it.
    """
    choice(optimizer, OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if shard not in SHARDS:
        raise ConfigError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    if not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        got = f"{gpus!r}" if len(repr(gpus)) < 30 else f"a {len(repr(gpus))}-digit number"
        raise ConfigError(f"--gpus must be between 1 and {MAX_GPUS:,}, got {got}")
    base_opt: Optimizer = "sgd" if optimizer == "sgd" else "adamw"
    if isinstance(shape, ModelFacts):  # checkpointing is the plan's own option, so the plan asks first
        check_modelled(shape, dtype=dtype, param_dtype=param_dtype, lora=lora, parallel=parallel,
                       checkpointing=checkpointing)
    est = estimate_memory(shape, batch=batch, seq_len=seq_len, mode=mode, dtype=dtype, param_dtype=param_dtype,
                          attention=attention, optimizer=base_opt, device_kind=device_kind,
                          dropout=dropout, new_tokens=new_tokens, hold_logits=hold_logits, lora=lora,
                          parallel=parallel)
    if isinstance(shape, ModelFacts):
        facts = shape
        layer = facts.layer_param_bytes // max(1, dtype_bytes(dtype))
        return _rescaled(est, facts.matmul_weights, lambda b, t, w: facts.cache_bytes(b, t, w), layer, None,
                         mode=mode, optimizer=optimizer, gpus=gpus, shard=shard, weights=weights, kv_dtype=kv_dtype,
                         checkpointing=False, parallel=None)
    return _rescaled(est, shape.matmul_weights(), lambda b, t, w: kv_cache_bytes(shape, b, t, w),
                     shape.layer_params(), shape, mode=mode, optimizer=optimizer, gpus=gpus, shard=shard,
                     weights=weights, kv_dtype=kv_dtype, checkpointing=checkpointing, parallel=parallel)


def _rescaled(est: MemoryEstimate, matmul_weights: int, kv_bytes: Callable[[int, int, int], int], layer_params: int,
              shape: ModelShape | None, *, mode: str, optimizer: str, gpus: int, shard: Shard, weights: str | None,
              kv_dtype: str | None, checkpointing: bool, parallel: Parallel | None) -> MemoryEstimate:
    """``est`` with the plan applied: 8-bit AdamW, weight formats, the KV dtype, sharding, checkpointing."""
    batch, seq_len = est.batch, est.seq_len
    plan_optimizer = choice(optimizer, OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    n = est.trained  # with LoRA only the adapters have optimizer state
    notes = list(est.notes)
    scale: dict[str, float] = {}
    new: dict[str, int] = {}
    trains = traits(mode).trains
    if not trains:
        if weights is not None:
            wname = normalize_weight_dtype(weights)
            # matmul weights include the lm_head; a tied embedding is that same tensor, stored once.
            mm = matmul_weights
            rest = n - mm
            new["params"] = int(mm * weight_bytes_per_param(wname) + rest * dtype_bytes(est.param_dtype))
            notes.append(f"weights {wname}: matmul weights at {weight_bytes_per_param(wname):g} B each "
                         "(int formats: a 2-byte scale per 128 weights), norms and embeddings at the compute dtype")
        if kv_dtype is not None:
            new["kv_cache"] = kv_bytes(batch, est.kv_tokens, dtype_bytes(kv_dtype))
    else:
        if weights is not None:
            raise ConfigError("--weights int8/int4 is for inference (--mode infer); training keeps float weights")
        if optimizer == "adamw8bit":
            master = est.master_weights
            scales = 2 * -(-n // BNB_BLOCK) * 4
            new["optimizer"] = 2 * n + scales + master
            notes.append("8-bit AdamW (bitsandbytes blockwise): two 1-byte moments + an fp32 scale per 2,048 values"
                         + (" + fp32 master weights" if master else ""))
    if gpus > 1 or shard != "ddp":
        if shard in ("zero1", "zero2", "zero3", "fsdp"):
            scale["optimizer"] = 1 / gpus
        if shard in ("zero2", "zero3", "fsdp"):
            scale["grads"] = 1 / gpus
        if shard in ("zero3", "fsdp"):
            scale["params"] = 1 / gpus
        notes.append(f"{shard} over {gpus} GPUs: per-GPU figures; batch is per GPU")
    if checkpointing and parallel is not None and not parallel.trivial:
        raise ConfigError("--checkpointing with --tp/--pp is not modelled yet: drop one of them")
    if checkpointing and trains:
        assert shape is not None, "checkpointing is modelled with lmprof's formulas only"
        per_layer = est.activations_per_layer
        once = est.activations - shape.n_layer * per_layer
        kept = shape.n_layer * batch * seq_len * shape.n_embd * dtype_bytes(est.param_dtype) + once
        new["activations"] = kept
        notes.append("full activation checkpointing: layer inputs kept, one layer's activations recomputed "
                     "at a time in backward (estimated, not validated)")
    elif checkpointing:
        raise ConfigError("--checkpointing applies to training (--mode train)")
    # Rescale each moment's categories.
    parts: dict[str, dict[str, int]] = {}
    full = {"params": est.params, "grads": est.grads, "optimizer": est.optimizer_state, "kv_cache": est.kv_cache,
            "activations": est.activations}
    for moment, cats in est.parts.items():
        out = {}
        if "activations" in new and "activations" in cats:
            if moment == "backward (layers)" and shape is not None:
                act, grads = _checkpointed_layers(shape, est, new["activations"])
                cats = {**cats, "activations": act, "grads": grads}
            else:
                cats = {**cats, "activations": new["activations"]}
        for cat, b in cats.items():
            if cat == "activations":
                pass  # already the checkpointed figure, or unchanged
            elif cat in new and full.get(cat):
                b = int(b * new[cat] / full[cat])
            out[cat] = int(b * scale.get(cat, 1.0))
        if shard in ("zero3", "fsdp") and gpus > 1:
            layer = est.layer_bytes or layer_params * dtype_bytes(est.param_dtype)
            gathered = layer + (est.layer_grad_bytes or layer if trains and "grads" in cats else 0)
            out["temporaries"] = out.get("temporaries", 0) + gathered
        parts[moment] = out
    moments = {k: sum(v.values()) for k, v in parts.items()}
    peak_at = max(moments, key=lambda k: moments[k])
    at_peak = {c: parts[peak_at].get(c, 0) for c in est.at_peak}

    def total(cat: str, value: int) -> int:
        value = new.get(cat, value)
        return int(value * scale.get(cat, 1.0))

    return replace(
        est, optimizer=plan_optimizer,
        params=total("params", est.params), grads=total("grads", est.grads),
        optimizer_state=total("optimizer", est.optimizer_state), kv_cache=total("kv_cache", est.kv_cache),
        activations=new.get("activations", est.activations),
        peak=moments[peak_at], peak_at=peak_at, moments=moments, at_peak=at_peak, parts=parts,
        temporaries=at_peak.get("temporaries", 0), notes=tuple(notes),
    )


def _checkpointed_layers(shape: ModelShape, est: MemoryEstimate, kept: int) -> tuple[int, int]:
    """Activations and grads at the worst point of a checkpointed backward through the layers.

    At the top layer: every layer input + one layer recomputed, only the head's gradients; at the
    bottom: one input + one layer recomputed, nearly every gradient. The larger of the two.
    """
    p_bytes = dtype_bytes(est.param_dtype)
    g_layer = est.layer_grad_bytes or shape.layer_params() * p_bytes
    g_head = (shape.vocab_size * shape.n_embd + shape.norm_params()) * p_bytes
    if est.trained != est.n_params:  # LoRA: the adapters' gradients only, no head
        g_head = max(0, est.grads - shape.n_layer * g_layer)
    inputs = kept - (est.activations - shape.n_layer * est.activations_per_layer)  # L layer inputs
    once = kept - inputs
    top = (kept + est.activations_per_layer, g_head)
    g_layers = (shape.n_layer - 1) * g_layer
    bottom = (once + inputs // shape.n_layer + est.activations_per_layer, g_head + g_layers)
    return max(top, bottom, key=lambda t: t[0] + t[1])


def largest_fitting(budget: int, peak_at: Callable[[int], int], limit: int) -> int:
    """The largest n in 1..limit with ``peak_at(n) <= budget`` (0 when not even 1 fits).

    Peak memory grows with n (batch or context), so a bisection needs O(log limit) estimates.
    """
    if peak_at(1) > budget:
        return 0
    if peak_at(limit) <= budget:
        return limit
    lo, hi = 1, limit  # peak_at(lo) fits, peak_at(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak_at(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo
