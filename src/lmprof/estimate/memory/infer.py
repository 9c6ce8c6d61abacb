"""Inference memory: parameters, the KV cache and one layer's prefill temporaries."""
from __future__ import annotations

from dataclasses import replace

from lmprof.estimate.memory.parallel import Parallel
from lmprof.estimate.memory.params import ParamCounts
from lmprof.estimate.memory.share import device_share
from lmprof.estimate.memory.result import AT_PEAK, DTYPE_BYTES, FP32, Attention, MemoryEstimate, MemoryItem
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.sdpa_path import sdpa_path


def infer_estimate(
    shape: ModelShape, pp: ParamCounts, batch: int, seq_len: int, kv_tokens: int, dtype: str, param_dtype: str,
    attention: Attention, device_kind: str, regime: str, params: int, buf: int, autocast: bool,
) -> MemoryEstimate:
    """Inference: parameters + KV cache + the prefill's largest per-layer temporaries."""
    s, b, h, a, f = seq_len, batch, shape.n_embd, shape.n_head, shape.ffn
    e = DTYPE_BYTES[dtype] if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]
    r = FP32 if param_dtype == "fp32" else e
    kv_bytes = e  # the cache is kept in the compute dtype
    kv_cache = kv_cache_bytes(shape, batch, kv_tokens, kv_bytes)
    sbh = s * b * h
    # No graph is kept: at any moment one layer's temporaries are alive next to the residual stream.
    resid = 2 * sbh * r  # x and the x + h being formed
    qkv = s * b * (h + 2 * shape.kv_heads * shape.head_dim) * e
    if attention == "math":
        attn = qkv + 2 * a * s * s * b * (FP32 if (autocast and device_kind != "cpu") else e) + s * s
    else:
        attn = qkv + sbh * e
    mlp = sbh * e + 2 * s * b * f * e  # ln_2 output, fc output, activation output
    weight_copies = 2 * (pp.matmul_weights + pp.linear_biases) if autocast else 0
    temporaries = resid + max(attn, mlp) + weight_copies
    logits = b * shape.vocab_size * e  # the lm_head's output for the last position only
    at_peak = {c: 0 for c in AT_PEAK}
    at_peak.update(params=params, buffers=buf, kv_cache=kv_cache, logits=logits, temporaries=temporaries)
    moments = {"prefill": sum(at_peak.values())}
    items = (
        MemoryItem("kv_cache", "keys and values", "2*L*kv_heads*head_dim*tokens*b*bytes", kv_cache, False, "kv_cache"),
        MemoryItem("prefill", "residual stream", f"2sbh*{r}", resid, False, "temporaries"),
        MemoryItem("prefill", "largest layer temporaries (attention or MLP)", "max(attn, mlp)", max(attn, mlp), False,
                   "temporaries"),
    ) + ((MemoryItem("autocast", "16-bit weight copies", "2*(matmul weights + biases)", weight_copies, False,
                     "temporaries"),) if weight_copies else ())
    return MemoryEstimate(
        shape=shape, mode="infer", batch=batch, seq_len=seq_len, dtype=dtype, param_dtype=param_dtype,
        attention=attention, optimizer="adamw", optimizer_impl="none", device_kind=device_kind, dropout=0.0,
        kv_tokens=kv_tokens, regime=regime, n_params=pp.total, params=params, grads=0, optimizer_state=0,
        master_weights=0, buffers=buf, activations=0, activations_per_layer=0, logits=logits, hold_logits=False,
        kv_cache=kv_cache,
        temporaries=temporaries, peak=moments["prefill"], peak_at="prefill", moments=moments, at_peak=at_peak,
        items=items,
        notes=("prefill of the whole prompt at once; decode steps need less",),
        attention_path=sdpa_path(device_kind, dtype, 0.0, training=False) if attention == "sdpa" else "math",
        parts={"prefill": dict(at_peak)},
    )


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, dtype_bytes: int) -> int:
    """2 (keys, values) x layers x kv_heads x head_dim x tokens x batch x bytes per element.

    Sliding-window layers hold their window only and multi-head latent attention its compressed
    latent (:meth:`ModelShape.kv_cache_elements`).
    """
    return shape.kv_cache_elements(tokens) * batch * dtype_bytes


def infer_on_device(est: MemoryEstimate, shape: ModelShape, pp: ParamCounts, par: Parallel,
                    param_dtype: str) -> MemoryEstimate:
    """``est`` (the whole model's inference) as one tensor-parallel rank of the fuller pipeline stage holds it.

    Parameters per rank and stage as in training; the KV cache holds the stage's layers and
    ``kv_heads / tp`` heads; the last position's logits are vocabulary-parallel. The prefill
    temporaries are left whole (an upper bound: the attention and MLP parts split by ``tp``).
    """
    best = est
    first = True
    for stage in sorted({0, par.pp - 1}):
        share = device_share(shape, pp, par=par, lora=None, stage=stage, param_dtype=param_dtype, dtype=est.dtype,
                             batch=est.batch, seq_len=est.seq_len)
        kv = -(-est.kv_cache * share.layers // (shape.n_layer * par.tp))
        logits = est.batch * share.vocab * DTYPE_BYTES[est.dtype] if share.last else 0
        buf = est.buffers * share.layers // shape.n_layer
        at_peak = {**est.at_peak, "params": share.param_bytes, "buffers": buf, "kv_cache": kv, "logits": logits}
        peak = sum(at_peak.values())
        if first or peak > best.peak:
            where = ("first" if share.first else "last") + " pipeline stage, " if par.pp > 1 else ""
            rank = "one tensor-parallel rank" if par.tp > 1 else "one device"
            plan = (par.describe(shape), f"figures for the {where}{rank}; prefill temporaries counted whole "
                    "(upper bound)")
            best = replace(est, params=share.param_bytes, buffers=buf, kv_cache=kv, logits=logits, peak=peak,
                           at_peak=at_peak, moments={"prefill": peak}, parts={"prefill": dict(at_peak)}, plan=plan,
                           device_params=share.params)
            first = False
    return best
