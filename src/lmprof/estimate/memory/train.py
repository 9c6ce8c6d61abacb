"""Training memory: static state, saved activations and the four candidate peak moments of a step."""
from __future__ import annotations

from lmprof.estimate.memory.activations import activation_items
from lmprof.estimate.memory.params import ParamCounts
from lmprof.estimate.memory.result import (
    AT_PEAK,
    DTYPE_BYTES,
    FP32,
    MemoryEstimate,
    MemoryItem,
    Optimizer,
    OptimizerImpl,
)
from lmprof.estimate.memory.parallel import Parallel, split_items
from lmprof.estimate.memory.share import DeviceShare
from lmprof.estimate.memory.step import TrainStep
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.dropout import Dropout
from lmprof.estimate.sdpa_path import sdpa_path


def train_estimate(
    shape: ModelShape, pp: ParamCounts, step: TrainStep, *, optimizer: Optimizer, optimizer_impl: OptimizerImpl,
    master_weights: bool, hold_logits: bool, regime: str, params: int, buf: int,
    share: DeviceShare | None = None, par: Parallel | None = None,
) -> MemoryEstimate:
    """One training step: the peak of the end of forward, the loss gradient, backward through the layers
    and the optimizer step (``step.dtype`` already resolved to the compute dtype).

    ``share`` (with ``par``): what one device holds under a LoRA plan and tensor/pipeline
    parallelism (:func:`lmprof.estimate.memory.share.device_share`); ``pp`` then stays the whole
    model's counts and ``params`` the device's parameter bytes.
    """
    dtype, param_dtype, attention, device_kind = step.dtype, step.param_dtype, step.attention, step.device_kind
    p_bytes = DTYPE_BYTES[param_dtype]
    par = par or Parallel()
    tr = share.trainable if share is not None else pp  # what has gradients and optimizer state here

    # Static training state.
    grads = tr.total * p_bytes
    opt_state, master, state_bytes = _optimizer_state(tr, optimizer, master_weights, param_dtype)

    items = activation_items(shape, step)
    if share is not None:
        items = split_items(items, par) + list(share.adapter_items)
        # A pipeline stage keeps the embedding's tensors (first) or the head's and the loss's (last).
        items = [i for i in items if i.per_layer or (share.first if i.block == "embedding" else share.last)]
    drops = step.drops
    path = sdpa_path(device_kind, dtype, drops.attention) if attention == "sdpa" else "math"
    per_layer = sum(i.bytes for i in items if i.per_layer)
    once = sum(i.bytes for i in items if not i.per_layer and i.category == "activations")
    layers = share.layers if share is not None else shape.n_layer
    in_flight = share.in_flight if share is not None else 1
    activations = in_flight * (layers * per_layer + once)
    b, s = step.batch, step.seq_len
    v = share.vocab if share is not None else shape.vocab_size  # vocabulary-parallel lm_head rows
    last = share is None or share.last
    logits = b * s * v * DTYPE_BYTES[dtype] if last else 0  # the lm_head's output dtype
    held = logits if hold_logits else 0  # what is left of them after the forward pass
    lp_bytes = FP32 if param_dtype == "fp32" else p_bytes

    # Candidate peaks (steady state: optimizer state exists from the first step on).
    fwd_extra = 0
    if step.autocast:
        # The autocast cache holds 16-bit copies of every linear bias too while forward runs, and
        # cross-entropy first casts the 16-bit logits to fp32.
        biases = share.linear_biases if share is not None else pp.linear_biases
        fwd_extra = biases * 2 + (b * s * v * FP32 if last else 0)
    # d(log-probs) from nll_loss, then d(logits) from log_softmax
    loss_grads = 2 * b * s * v * lp_bytes if last else 0
    opt_temp = _optimizer_temporaries(optimizer, optimizer_impl, device_kind, tr, state_bytes)
    bwd_acts, bwd_grads, bwd_temp = _backward_layers(shape, pp, items, step, share)
    static = {"params": params, "buffers": buf, "optimizer": opt_state}
    # Pipeline stages accumulate gradients over micro-batches: they live through the whole step.
    early = {"grads": grads} if share is not None and share.persistent_grads else {}
    parts = {
        # While the loss is computed the logits are alive whether or not the step keeps them.
        "end of forward": {**static, **early, "activations": activations, "logits": logits, "temporaries": fwd_extra},
        "backward (loss gradient)": {**static, **early, "activations": activations, "logits": held,
                                     "temporaries": loss_grads},
        "backward (layers)": {**static, "activations": bwd_acts, "grads": grads if early else bwd_grads,
                              "logits": held, "temporaries": bwd_temp},
        "optimizer step": {**static, "grads": grads, "logits": held, "temporaries": opt_temp},
    }
    moments = {name: sum(p.values()) for name, p in parts.items()}
    peak_at = max(moments, key=lambda k: moments[k])
    peak = moments[peak_at]
    at_peak = {c: int(parts[peak_at].get(c, 0)) for c in AT_PEAK}
    temporaries = at_peak["temporaries"]
    return MemoryEstimate(
        shape=shape, mode="train", batch=step.batch, seq_len=step.seq_len, dtype=dtype, param_dtype=param_dtype,
        attention=attention, optimizer=optimizer, optimizer_impl=_impl(optimizer_impl, device_kind),
        device_kind=device_kind, dropout=drops.largest, kv_tokens=0, regime=regime, n_params=pp.total,
        params=params, grads=grads, optimizer_state=opt_state, master_weights=master, buffers=buf,
        activations=activations, activations_per_layer=per_layer, logits=logits, hold_logits=hold_logits,
        kv_cache=0,
        temporaries=temporaries, peak=peak, peak_at=peak_at, moments=moments, at_peak=at_peak,
        items=tuple(items), notes=_notes(drops, attention, path, device_kind), attention_path=path, parts={k: {c: int(b) for c, b in v.items()} for k, v in parts.items()},
        trainable_params=tr.total,
    )


def _optimizer_state(pp: ParamCounts, optimizer: str, master_weights: bool, param_dtype: str) -> tuple[int, int, int]:
    """(optimizer state bytes, of them the fp32 master weights, bytes per moment element).

    AdamW keeps two moments and a 4-byte step per tensor, SGD one momentum buffer; moments are fp32
    whenever the parameters are or a master copy exists.
    """
    p_bytes = DTYPE_BYTES[param_dtype]
    state_bytes = FP32 if (master_weights or param_dtype == "fp32") else p_bytes
    n_states = 2 if optimizer == "adamw" else 1
    master = pp.total * FP32 if master_weights else 0
    step_scalars = pp.tensors * FP32 if optimizer == "adamw" else 0
    return n_states * pp.total * state_bytes + master + step_scalars, master, state_bytes


def _backward_layers(
    shape: ModelShape, pp: ParamCounts, items: list[MemoryItem], step: TrainStep, share: DeviceShare | None = None,
) -> tuple[int, int, int]:
    """(activations, gradients, temporaries) alive at the higher end of backward through the layers.

    Backward runs the layers top to bottom: each layer frees its activations and adds its
    gradients, so the level is linear in the layer count and peaks at the first or last layer.
    Alive besides: the lm_head/ln_f gradients and one MLP's backward temporaries (the residual
    gradient, the hidden-size gradient and the projection's weight gradient).
    """
    p_bytes = DTYPE_BYTES[step.param_dtype]
    per_layer = sum(i.bytes for i in items if i.per_layer)
    once = sum(i.bytes for i in items if not i.per_layer and i.category == "activations")
    b, s = step.batch, step.seq_len
    head_once = sum(i.bytes for i in items if not i.per_layer and i.block in ("ln_f", "lm_head", "loss"))
    rest_once = once - head_once
    t = share.tp if share is not None else 1
    seq_split = t if share is not None and share.sp else 1
    if share is None:
        g_head = (shape.vocab_size * shape.n_embd + shape.norm_params()) * p_bytes
        g_layer, proj_grad, n, in_flight = pp.layer_params * p_bytes, shape.n_embd * shape.ffn, shape.n_layer, 1
    else:
        g_head, g_layer = share.head * p_bytes, share.trainable.layer_params * p_bytes
        proj_grad, n, in_flight = share.proj_grad, share.layers, share.in_flight
    e_act = DTYPE_BYTES[step.dtype]
    r_act = FP32 if step.param_dtype == "fp32" else p_bytes
    # The residual gradient (split along the sequence with SP), the MLP's hidden gradient (split by
    # TP) and the output projection's weight gradient (an adapter's only, with LoRA).
    bwd_temp = (b * s * shape.n_embd * r_act // seq_split + b * s * shape.ffn * e_act // t
                + proj_grad * p_bytes)
    if shape.family == "gpt2" and step.attention == "sdpa":
        # Hugging Face GPT-2's composite tanh GELU: its backward holds one more d_ff-wide gradient
        # next to the incoming one (seen on the CPU allocation timeline).
        bwd_temp += b * s * shape.ffn * e_act // t
    if shape.family == "mixtral" and (share is None or share.lora is None):
        # Mixtral's experts are 3-D weights: backward builds each expert's weight gradient apart and
        # writes it into the layer's 3-D gradient, which exists before the layer's backward ends. Both
        # are counted, an upper bound: measured CPU peaks are 3-5% below it (tests/test_models.py),
        # where leaving them out put the estimate 7-9% under (a fit check would over-promise).
        bwd_temp += 2 * shape.n_experts * shape.expert_params() * p_bytes // t
    # The other micro-batches in flight on this stage keep all their activations meanwhile.
    others = (in_flight - 1) * (n * per_layer + once)
    layers_top = n * per_layer
    layers_bottom = per_layer + (n - 1) * g_layer
    top_is_higher = layers_top >= layers_bottom
    return (others + (n if top_is_higher else 1) * per_layer + rest_once,
            g_head + (0 if top_is_higher else (n - 1) * g_layer), bwd_temp)


def _notes(drops: Dropout, attention: str, path: str, device_kind: str) -> tuple[str, ...]:
    notes: list[str] = []
    if attention == "sdpa" and path == "math":
        notes.append(f"sdpa runs its math kernel here (attention dropout {drops.attention:g} in training on "
                     f"{device_kind}): the scores, probabilities and dropout mask are kept")
    elif drops.attention and attention == "sdpa":
        notes.append("fused attention regenerates its dropout mask from the RNG state: no mask kept")
    notes.append("first step only: optimizer state is created inside optimizer.step(), so the first step's "
                 "forward/backward run without it")
    return tuple(notes)


def _impl(impl: str, device_kind: str) -> str:
    # torch picks foreach only when every tensor is on CUDA (or another accelerator); CPU loops.
    if impl == "auto":
        return "for-loop" if device_kind == "cpu" else "foreach"
    return impl


def _optimizer_temporaries(optimizer: str, impl: str, device_kind: str, pp: ParamCounts, state_bytes: int) -> int:
    """Extra bytes while optimizer.step() runs.

    AdamW foreach builds sqrt(v) for every parameter at once (one parameter-sized list); the
    for-loop version builds sqrt(v) and sqrt(v)/c for one tensor at a time (twice the largest
    tensor); fused kernels need none. SGD with momentum and no weight decay works in place.
    """
    if optimizer != "adamw":
        return 0
    impl = _impl(impl, device_kind)
    if impl == "foreach":
        return pp.total * state_bytes
    if impl == "for-loop":
        return 2 * pp.largest * state_bytes
    return 0
