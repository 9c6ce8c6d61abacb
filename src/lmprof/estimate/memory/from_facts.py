"""The memory estimate of a model the describer read (:class:`~lmprof.estimate.facts.ModelFacts`).

For a family lmprof has no formulas for, the figures come from the model itself, run on the meta
device (:mod:`lmprof.measure.model_facts`): the parameters and their bytes as built, the bytes
autograd saves for backward, the highest level of live tensors over a training step's forward and
backward (activations, temporaries and the gradients made so far), the prefill's highest level and
what the model's own cache holds. The static state (gradients, optimizer state) and the optimizer
step's moment follow the same rules as the formula estimate (:mod:`.train`).

One dtype throughout: the describer runs the model in its parameter dtype (no autocast).
"""
from __future__ import annotations

from typing import Any

from lmprof.errors import ConfigError
from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.memory.lora import Lora
from lmprof.estimate.memory.parallel import Parallel
from lmprof.estimate.memory.params import ParamCounts
from lmprof.estimate.memory.result import AT_PEAK, DTYPE_BYTES, MemoryEstimate, MemoryItem, Optimizer, OptimizerImpl
from lmprof.estimate.memory.train import _impl, _optimizer_state, _optimizer_temporaries
from lmprof.modes import Mode, traits


def facts_param_counts(facts: ModelFacts) -> ParamCounts:
    """What the optimizer rules need of the parameters, as the describer counted them."""
    return ParamCounts(total=facts.params, tensors=facts.param_tensors, largest=facts.largest_tensor,
                       matmul_weights=facts.matmul_weights, matmul_weights_per_layer=0, linear_biases=0,
                       layer_params=facts.layer_param_bytes // max(1, DTYPE_BYTES.get(facts.dtype, 4)))


def check_modelled(facts: ModelFacts, *, dtype: str, param_dtype: str, lora: Lora | None = None,
                   parallel: Parallel | None = None, checkpointing: bool = False, buffers: int | None = None) -> None:
    """ConfigError naming the first option given that a model read off the meta device has no figures for.

    Its figures are what the model did in one dtype, so neither lmprof's formulas for adapters,
    parallelism, checkpointing or the built-in GPT's mask buffer nor autocast apply to it.
    """
    for given, what in ((lora is not None, "LoRA/QLoRA"), (parallel is not None and not parallel.trivial, "--tp/--pp"),
                        (checkpointing, "--checkpointing"), (buffers is not None, "a causal-mask buffer size")):
        if given:
            raise ConfigError(f"{what} is not modelled for {facts.family!r} (its figures are read off the model, "
                              "not lmprof's formulas)")
    if param_dtype != dtype:
        raise ConfigError(f"{facts.family!r} is read off the model in one dtype: give --param-dtype {dtype} "
                          f"(autocast of {param_dtype} parameters is not modelled for it)")


def estimate_from_facts(
    facts: ModelFacts,
    *,
    batch: int,
    seq_len: int,
    mode: Mode,
    dtype: str,
    optimizer: Optimizer,
    optimizer_impl: OptimizerImpl,
    master_weights: bool | None,
    device_kind: str,
    new_tokens: int,
    hold_logits: bool,
) -> MemoryEstimate:
    """Every category of memory for one training step or one inference run, from what the describer read.

    Reached through :func:`~lmprof.estimate.memory.estimate.estimate_memory`, which holds the defaults
    and, first, :func:`check_modelled`. ``facts`` must have been read in ``dtype`` (the parameters' and
    the compute dtype) at ``seq_len`` tokens (training; for inference the prompt); other batch sizes
    are affine in the batch.
    """
    if dtype != facts.dtype:
        raise ConfigError(f"the model was described in {facts.dtype}, not {dtype}: describe it in {dtype}")
    if seq_len != facts.seq_len:
        raise ConfigError(f"the model was described at {facts.seq_len} tokens, not {seq_len}")
    if batch <= 0:
        raise ConfigError(f"batch size must be positive, got {batch}")
    pp = facts_param_counts(facts)
    params = facts.param_bytes or facts.params * DTYPE_BYTES[dtype]
    if master_weights is None:
        master_weights = dtype != "fp32"
    if dtype == "fp32":
        master_weights = False
    common: dict[str, Any] = dict(shape=None, batch=batch, seq_len=seq_len, dtype=dtype, param_dtype=dtype,
                  attention="sdpa", device_kind=device_kind, dropout=0.0, n_params=facts.params, params=params,
                  buffers=facts.buffer_bytes, source="model", layers=facts.n_layer)
    if traits(mode).generates:
        return _infer(facts, pp, batch, seq_len, new_tokens, dtype, common)
    if facts.train is None:
        raise ConfigError("the model was not described for training (no training pass)")
    t = facts.train
    grads = int(params)
    opt_state, master, state_bytes = _optimizer_state(pp, optimizer, master_weights, dtype)
    activations = t.at(batch, "saved")
    live = t.at(batch, "live") + (t.logits * batch // t.batch if hold_logits else 0)
    grads_at_peak = min(t.grads_at_peak, live)
    acts_at_peak = min(activations, live - grads_at_peak)
    static = {"params": int(params), "buffers": facts.buffer_bytes, "optimizer": opt_state}
    logits = t.logits * batch // t.batch
    parts = {
        f"{t.peak_at} (highest level)": {**static, "grads": grads_at_peak, "activations": acts_at_peak,
                                         "temporaries": live - grads_at_peak - acts_at_peak},
        "optimizer step": {**static, "grads": grads, "logits": logits if hold_logits else 0,
                           "temporaries": _optimizer_temporaries(optimizer, optimizer_impl, device_kind, pp,
                                                                 state_bytes)},
    }
    moments = {k: sum(v.values()) for k, v in parts.items()}
    peak_at = max(moments, key=lambda k: moments[k])
    at_peak = {c: int(parts[peak_at].get(c, 0)) for c in AT_PEAK}
    items = tuple(MemoryItem(block, "read off the model", "", int(b * batch / t.batch), False)
                  for block, b in t.saved_by_block)
    return MemoryEstimate(
        **common, mode="train", optimizer=optimizer, optimizer_impl=_impl(optimizer_impl, device_kind),
        kv_tokens=0, regime=f"{dtype} parameters, gradients and compute (read off the model on the meta device)"
        + ("; fp32 master weights and moments" if master else ""),
        grads=grads, optimizer_state=opt_state, master_weights=master, activations=activations,
        activations_per_layer=0, logits=logits, hold_logits=hold_logits, kv_cache=0,
        temporaries=at_peak["temporaries"], peak=moments[peak_at], peak_at=peak_at, moments=moments, at_peak=at_peak,
        items=items, parts=parts, attention_path="as the model runs", trainable_params=facts.params,
        notes=(f"read off the model on the meta device: saved tensors and the live level of forward and backward "
               f"at batch {t.batch} and {t.batch + 1} (affine in the batch)",),
        layer_bytes=facts.layer_param_bytes, layer_grad_bytes=facts.layer_param_bytes,
    )


def _infer(facts: ModelFacts, pp: ParamCounts, batch: int, seq_len: int, new_tokens: int, dtype: str,
           common: dict[str, Any]) -> MemoryEstimate:
    """Parameters + the cache at prompt + new tokens + what else the prefill holds at its highest level."""
    peak = facts.prefill_peak_at(batch)
    if peak is None:
        raise ConfigError("the model was not described for inference (no prefill pass)")
    cache_prompt = facts.cache_bytes(batch, seq_len)
    tokens = seq_len + new_tokens
    kv_cache = facts.cache_bytes(batch, tokens)
    temporaries = max(0, peak - cache_prompt)  # the prefill's activations, the logits of every position
    at_peak = {c: 0 for c in AT_PEAK}
    at_peak.update(params=int(common["params"]), buffers=facts.buffer_bytes,
                   kv_cache=kv_cache, temporaries=temporaries)
    total = sum(at_peak.values())
    kinds = ", ".join(f"{k} {v:,}" for k, v in facts.cache_by_kind(tokens).items())
    items = (MemoryItem("kv_cache", f"the model's own cache ({kinds} elements per sequence)", "describer", kv_cache,
                        False, "kv_cache"),
             MemoryItem("prefill", "the prefill's live tensors besides the cache (logits of every position included)",
                        "describer", temporaries, False, "temporaries"))
    return MemoryEstimate(
        **common, mode="infer", optimizer="adamw", optimizer_impl="none", kv_tokens=tokens,
        regime=f"{dtype} parameters, no autocast (read off the model on the meta device)",
        grads=0, optimizer_state=0, master_weights=0, activations=0, activations_per_layer=0, logits=0,
        hold_logits=False, kv_cache=kv_cache, temporaries=temporaries, peak=total, peak_at="prefill",
        moments={"prefill": total}, at_peak=at_peak, items=items, parts={"prefill": dict(at_peak)},
        attention_path="as the model runs",
        notes=("prefill of the whole prompt at once, read off the model on the meta device; the cache as the model "
               "keeps it (attention KV grows with the tokens, windows cap it, recurrent states do not grow)",),
    )
