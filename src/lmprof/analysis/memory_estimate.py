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
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from lmprof.errors import ConfigError
from lmprof.workloads.shape import ModelShape

if TYPE_CHECKING:  # the measured side imports torch; the estimate must not
    from lmprof.measure.memory import MeasuredMemory
    from lmprof.record.run import Metric

Mode = Literal["train", "infer"]
Attention = Literal["math", "sdpa"]
MODES: tuple[Mode, ...] = ("train", "infer")
ATTENTIONS: tuple[Attention, ...] = ("math", "sdpa")
Optimizer = Literal["adamw", "sgd"]
# What an estimate's ``optimizer`` may say: the plan (analysis/fit.py) also names bitsandbytes' 8-bit AdamW.
EstimateOptimizer = Literal["adamw", "adamw8bit", "sgd"]
OptimizerImpl = Literal["auto", "foreach", "for-loop", "fused"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Categories of the breakdown, in the order they are shown; ``at_peak`` splits the peak into them.
_AT_PEAK = ("params", "buffers", "grads", "optimizer", "activations", "logits", "kv_cache", "temporaries")
FP32 = 4
INT64 = 8
BOOL = 1


@dataclass(frozen=True)
class MemoryItem:
    """One kind of tensor kept in memory: which block keeps it, what it is and its size in bytes.

    ``per_layer`` items are counted once per transformer layer; the others once per model.
    """

    block: str
    what: str
    formula: str
    bytes: int
    per_layer: bool
    category: str = "activations"


@dataclass(frozen=True)
class MemoryEstimate:
    """The analytic breakdown of one configuration (all figures in bytes).

    ``peak`` is the largest of the candidate moments in ``moments``; ``peak_at`` names it.
    ``activations`` is what the forward pass leaves alive for the backward pass (all layers plus the
    embedding, final norm, lm_head and loss); ``logits`` is the (batch, seq, vocab) lm_head output,
    alive while the loss is computed and, with ``hold_logits``, until the step ends (train), or the
    last position's logits (infer).
    """

    shape: ModelShape
    mode: Mode
    batch: int
    seq_len: int
    dtype: str
    param_dtype: str
    attention: Attention
    optimizer: EstimateOptimizer
    optimizer_impl: str
    device_kind: str
    dropout: float
    kv_tokens: int
    regime: str
    n_params: int
    params: int
    grads: int
    optimizer_state: int
    master_weights: int
    buffers: int
    activations: int
    activations_per_layer: int
    logits: int
    hold_logits: bool
    kv_cache: int
    temporaries: int
    peak: int
    peak_at: str
    moments: dict[str, int]
    at_peak: dict[str, int]
    items: tuple[MemoryItem, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    parts: dict[str, dict[str, int]] = field(default_factory=dict)  # moment -> category -> bytes

    @property
    def static(self) -> int:
        """Bytes that live for the whole run: parameters, buffers, optimizer state (and grads in train)."""
        return self.params + self.buffers + self.grads + self.optimizer_state

    def breakdown(self) -> list[dict[str, Any]]:
        """Rows (category, bytes, at_peak, note): each category's size and its share of the peak.

        ``bytes`` is the category's full size; ``at_peak`` what of it is alive at the peak moment
        (gradients, say, are not yet allocated when the backward pass starts). ``at_peak`` adds up to
        the peak row.
        """
        a = self.at_peak
        rows: list[dict[str, Any]] = [
            {"category": "params", "bytes": self.params, "at_peak": a["params"],
             "note": f"{self.n_params:,} x {_name_bytes(self.param_dtype)}"},
            {"category": "buffers", "bytes": self.buffers, "at_peak": a["buffers"], "note": "causal mask, bool, per layer"},
        ]
        if self.mode == "train":
            rows += [
                {"category": "grads", "bytes": self.grads, "at_peak": a["grads"],
                 "note": f"same dtype as the params ({self.param_dtype})"},
                {"category": "optimizer", "bytes": self.optimizer_state, "at_peak": a["optimizer"],
                 "note": self._optimizer_note()},
                {"category": "activations", "bytes": self.activations, "at_peak": a["activations"],
                 "note": f"saved for backward, {self.activations_per_layer:,} B per layer"},
                {"category": "logits", "bytes": self.logits, "at_peak": a["logits"],
                 "note": "b*s*V lm_head output, " + ("held by the caller until the step ends" if self.hold_logits
                                                     else "freed once the loss is computed")},
            ]
        else:
            rows += [
                {"category": "kv_cache", "bytes": self.kv_cache, "at_peak": a["kv_cache"],
                 "note": f"2 x {self.shape.n_layer} layers x {self.shape.kv_heads} kv heads x "
                         f"{self.shape.head_dim} x {self.kv_tokens} tokens x {self.batch} x {DTYPE_BYTES[self.dtype]} B"},
                {"category": "logits", "bytes": self.logits, "at_peak": a["logits"], "note": "last position only"},
            ]
        rows.append({"category": "temporaries", "bytes": self.temporaries, "at_peak": a["temporaries"],
                     "note": f"extra at the peak moment ({self.peak_at})"})
        rows.append({"category": "peak", "bytes": self.peak, "at_peak": self.peak, "note": self.peak_at})
        return rows

    def _optimizer_note(self) -> str:
        parts = {"adamw": "two fp32 moments", "sgd": "one fp32 momentum buffer",
                 "adamw8bit": "two 1-byte moments + fp32 block scales"}[self.optimizer]
        if self.master_weights:
            parts += " + fp32 master weights"
        if self.optimizer.startswith("adamw"):
            parts += " + a step scalar per tensor"
        return parts

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = self.shape.to_dict()
        return out


# -- parameter bookkeeping --------------------------------------------------------------------


@dataclass(frozen=True)
class _Params:
    total: int
    tensors: int
    largest: int
    matmul_weights: int
    matmul_weights_per_layer: int
    linear_biases: int
    layer_params: int


def _param_parts(shape: ModelShape) -> _Params:
    """Counts the estimate needs beyond n_params: tensors, the largest tensor, matmul weights.

    Tensor counts follow the built-in GPT's layout (fused qkv projection); for other families they
    only size the AdamW step scalars (4 B per tensor), so the layout difference is negligible.
    """
    d, v = shape.n_embd, shape.vocab_size
    f = shape.expert_ffn if shape.moe else shape.ffn
    has_bias = 1 if shape.bias else 0
    norm_tensors = 2 if shape.has_norm_bias else 1
    mlp_mats = (3 if shape.gated else 2) * (shape.n_experts or 1)
    layer_w = shape.attn_weights() + shape.mlp_weights()
    layer_b = shape.attn_biases() + (shape.mlp_params() - shape.mlp_weights())
    layer_tensors = shape.norms_per_layer * norm_tensors + 2 * (1 + has_bias) + mlp_mats * (1 + has_bias)
    tensors = 1 + (1 if shape.pos == "learned" else 0) + (0 if shape.tied else 1)
    tensors += shape.n_layer * layer_tensors + norm_tensors
    largest = max(v * d, d * (shape.q_dim + 2 * shape.kv_dim), f * d * (shape.n_experts or 1) if shape.family in (
        "mixtral",) else f * d, shape.positions * d)
    # The lm_head's weight is a matmul weight (tied or not); the token embedding is a lookup.
    return _Params(
        total=shape.n_params(),
        tensors=tensors,
        largest=largest,
        matmul_weights=shape.matmul_weights(),
        matmul_weights_per_layer=layer_w,
        linear_biases=shape.n_layer * layer_b,
        layer_params=shape.layer_params(),
    )


def _norm_params(shape: ModelShape) -> int:
    return shape.norm_params()


def causal_mask_bytes(shape: ModelShape) -> int:
    """The built-in GPT's ``mask`` buffer: a (block_size, block_size) bool per layer (none elsewhere)."""
    if shape.family not in ("", "gpt"):
        return 0
    return shape.n_layer * shape.block_size * shape.block_size * BOOL


# -- the estimate -----------------------------------------------------------------------------


def estimate_memory(
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    mode: Mode = "train",
    dtype: str = "fp32",
    param_dtype: str = "fp32",
    attention: Attention = "math",
    optimizer: Optimizer = "adamw",
    optimizer_impl: OptimizerImpl = "auto",
    master_weights: bool | None = None,
    device_kind: str = "cuda",
    dropout: float = 0.0,
    new_tokens: int = 0,
    hold_logits: bool = False,
    buffers: int | None = None,
) -> MemoryEstimate:
    """Estimate every category of memory for one training step or one inference run.

    ``dtype`` is the compute dtype (``bf16``/``fp16`` mean torch.autocast when ``param_dtype`` is
    fp32, lmprof's mixed precision); ``param_dtype`` bf16/fp16 means the parameters themselves are
    16-bit, and then ``master_weights`` (default True) adds an fp32 copy in the optimizer.
    ``optimizer_impl`` picks the AdamW/SGD temporaries (``auto``: foreach on CUDA, for-loop on CPU).
    ``device_kind`` (``cpu`` or a GPU kind) decides what differs between the two: autocast keeps
    softmax in fp32 on CUDA only, dropout masks are bool on CUDA and full-width on the CPU, and the
    default optimizer implementation.
    Inference caches ``seq_len + new_tokens`` tokens per sequence. ``hold_logits``: the step keeps
    the (b, s, V) logits until it ends (``logits, loss = model(x, y)`` in the step's scope); lmprof's
    own train step keeps only the loss, so by default they die with the forward pass.
    ``buffers`` overrides the built-in GPT's causal-mask buffer size.
    """
    _validate(shape, batch, seq_len, mode, dtype, param_dtype, attention, optimizer, optimizer_impl, dropout, new_tokens)
    if param_dtype != "fp32":
        dtype = param_dtype  # 16-bit parameters compute in their own dtype, no autocast
    pp = _param_parts(shape)
    p_bytes = DTYPE_BYTES[param_dtype]
    autocast = dtype != "fp32" and param_dtype == "fp32"
    if param_dtype == "fp32":
        master_weights = False  # the parameters already are the fp32 master copy
    elif master_weights is None:
        master_weights = True
    regime = _regime(dtype, param_dtype, master_weights, mode)

    params = pp.total * p_bytes
    buf = causal_mask_bytes(shape) if buffers is None else buffers
    notes: list[str] = []
    kv_tokens = seq_len + new_tokens if mode == "infer" else 0

    if mode == "infer":
        return _infer(shape, pp, batch, seq_len, kv_tokens, dtype, param_dtype, attention, device_kind,
                      regime, params, buf, autocast)

    # Static training state.
    grads = pp.total * p_bytes
    state_bytes = FP32 if (master_weights or param_dtype == "fp32") else p_bytes
    n_states = 2 if optimizer == "adamw" else 1
    master = pp.total * FP32 if master_weights else 0
    step_scalars = pp.tensors * FP32 if optimizer == "adamw" else 0
    opt_state = n_states * pp.total * state_bytes + master + step_scalars

    items = activation_items(shape, batch, seq_len, dtype, param_dtype, attention, device_kind, dropout)
    per_layer = sum(i.bytes for i in items if i.per_layer)
    once = sum(i.bytes for i in items if not i.per_layer and i.category == "activations")
    activations = shape.n_layer * per_layer + once
    b, s, v = batch, seq_len, shape.vocab_size
    logits = b * s * v * DTYPE_BYTES[dtype]  # the lm_head's output dtype
    held = logits if hold_logits else 0  # what is left of them after the forward pass
    lp_bytes = FP32 if param_dtype == "fp32" else p_bytes

    # Candidate peaks (steady state: optimizer state exists from the first step on).
    fwd_extra = 0
    if autocast:
        # The autocast cache holds 16-bit copies of every linear bias too while forward runs, and
        # cross-entropy first casts the 16-bit logits to fp32.
        fwd_extra = pp.linear_biases * 2 + b * s * v * FP32
    loss_grads = 2 * b * s * v * lp_bytes  # d(log-probs) from nll_loss, then d(logits) from log_softmax
    opt_temp = _optimizer_temporaries(optimizer, optimizer_impl, device_kind, pp, state_bytes)
    # Backward through the layers, top to bottom: each layer frees its activations and adds its
    # gradients, so the level is linear in the layer count and peaks at the first or last layer.
    # Alive besides: the lm_head/ln_f gradients and one MLP's backward temporaries (the residual
    # gradient, the hidden-size gradient and the projection's weight gradient).
    head_once = sum(i.bytes for i in items if not i.per_layer and i.block in ("ln_f", "lm_head", "loss"))
    rest_once = once - head_once
    g_head = (v * shape.n_embd + _norm_params(shape)) * p_bytes
    g_layer = pp.layer_params * p_bytes
    e_act = DTYPE_BYTES[dtype]
    r_act = FP32 if param_dtype == "fp32" else p_bytes
    bwd_temp = b * s * shape.n_embd * r_act + b * s * shape.ffn * e_act + shape.n_embd * shape.ffn * p_bytes
    if shape.family == "gpt2" and attention == "sdpa":
        # Hugging Face GPT-2's composite tanh GELU: its backward holds one more d_ff-wide gradient
        # next to the incoming one (seen on the CPU allocation timeline).
        bwd_temp += b * s * shape.ffn * e_act
    layers_top = shape.n_layer * per_layer
    layers_bottom = per_layer + (shape.n_layer - 1) * g_layer
    static = {"params": params, "buffers": buf, "optimizer": opt_state}
    top_is_higher = layers_top >= layers_bottom
    parts = {
        # While the loss is computed the logits are alive whether or not the step keeps them.
        "end of forward": {**static, "activations": activations, "logits": logits, "temporaries": fwd_extra},
        "backward (loss gradient)": {**static, "activations": activations, "logits": held,
                                     "temporaries": loss_grads},
        "backward (layers)": {
            **static,
            "activations": (shape.n_layer if top_is_higher else 1) * per_layer + rest_once,
            "grads": g_head + (0 if top_is_higher else (shape.n_layer - 1) * g_layer),
            "logits": held,
            "temporaries": bwd_temp,
        },
        "optimizer step": {**static, "grads": grads, "logits": held, "temporaries": opt_temp},
    }
    moments = {name: sum(p.values()) for name, p in parts.items()}
    peak_at = max(moments, key=lambda k: moments[k])
    peak = moments[peak_at]
    at_peak = {c: int(parts[peak_at].get(c, 0)) for c in _AT_PEAK}
    temporaries = at_peak["temporaries"]
    if dropout > 0 and attention == "sdpa":
        notes.append("fused attention regenerates its dropout mask from the RNG state: no mask kept"
                     if device_kind != "cpu" else "sdpa with dropout runs the unfused math kernel on the CPU")
    notes.append("first step only: optimizer state is created inside optimizer.step(), so the first step's "
                 "forward/backward run without it")
    return MemoryEstimate(
        shape=shape, mode="train", batch=batch, seq_len=seq_len, dtype=dtype, param_dtype=param_dtype,
        attention=attention, optimizer=optimizer, optimizer_impl=_impl(optimizer_impl, device_kind),
        device_kind=device_kind, dropout=dropout, kv_tokens=0, regime=regime, n_params=pp.total,
        params=params, grads=grads, optimizer_state=opt_state, master_weights=master, buffers=buf,
        activations=activations, activations_per_layer=per_layer, logits=logits, hold_logits=hold_logits,
        kv_cache=0,
        temporaries=temporaries, peak=peak, peak_at=peak_at, moments=moments, at_peak=at_peak,
        items=tuple(items), notes=tuple(notes), parts={k: {c: int(b) for c, b in v.items()} for k, v in parts.items()},
    )


def activation_items(
    shape: ModelShape,
    batch: int,
    seq_len: int,
    dtype: str = "fp32",
    param_dtype: str = "fp32",
    attention: Attention = "math",
    device_kind: str = "cuda",
    dropout: float = 0.0,
) -> list[MemoryItem]:
    """The tensors the forward pass saves for backward, block by block (bytes per layer or once).

    Paper terms (16-bit, per layer): layer-norm inputs 4sbh, QKV input 2sbh, Q and K 4sbh, softmax
    output 2as^2b, its dropout mask as^2b and output 2as^2b, V 2sbh, projection input 2sbh and
    dropout mask sbh; MLP inputs 2sbh + 8sbh, GELU input 8sbh, dropout mask sbh.
    """
    if shape.family in HF_LLAMA_LAYOUT and attention == "sdpa" and dtype == param_dtype and not dropout:
        return _hf_llama_items(shape, batch, seq_len, DTYPE_BYTES[param_dtype])
    if shape.family in HF_GPT2_LAYOUT and attention == "sdpa" and dtype == param_dtype and not dropout:
        return _hf_gpt2_items(shape, batch, seq_len, DTYPE_BYTES[param_dtype])
    if shape.family == "gemma2" and dtype == param_dtype and not dropout:  # transformers runs it eager
        return _hf_gemma2_items(shape, batch, seq_len, DTYPE_BYTES[param_dtype])
    if shape.family in HF_OTHER_LAYOUTS and attention == "sdpa" and dtype == param_dtype and not dropout:
        return _hf_layernorm_items(shape, batch, seq_len, DTYPE_BYTES[param_dtype])
    s, b, h, a = seq_len, batch, shape.n_embd, shape.n_head
    f, v = shape.ffn, shape.vocab_size
    kv = shape.kv_heads * shape.head_dim
    autocast = dtype != "fp32" and param_dtype == "fp32"
    e = DTYPE_BYTES[dtype] if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # matmul inputs
    r = FP32 if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # residual stream, norm inputs
    # Softmax output: autocast on CUDA runs softmax in fp32 and the next matmul keeps a 16-bit cast.
    sm = FP32 if (param_dtype == "fp32" and (dtype == "fp32" or device_kind != "cpu")) else e
    sm_cast = e if (autocast and device_kind != "cpu") else 0
    lp = FP32 if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # log-softmax output
    stats = 2 if shape.norm == "layernorm" else 1  # mean and rstd (or rstd), fp32
    sbh = s * b * h
    drop = dropout > 0
    # CUDA's fused dropout keeps a bool mask; the CPU path keeps a scaled mask in the input's dtype.
    cpu = device_kind == "cpu"

    def mask(dtype_bytes: int) -> tuple[str, int]:
        return ("dropout mask (scaled, input dtype)", dtype_bytes) if cpu else ("dropout mask (bool)", BOOL)

    # sdpa with dropout on the CPU falls back to the unfused math kernel, which keeps the scores.
    fused = attention == "sdpa" and not (drop and cpu)
    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True, category: str = "activations") -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer, category))

    # Once: embedding.
    add("embedding", "positions (int64)", "s*8", s * INT64, per_layer=False)
    if drop:
        what, mb = mask(r)
        add("embedding", what, f"sbh*{mb}", sbh * mb, per_layer=False)
    # Per layer.
    add("ln_1", "input (residual stream)", f"sbh*{r}", sbh * r)
    add("ln_1", "mean/rstd (fp32)", f"{stats}*sb*4", stats * s * b * FP32)
    add("attn.qkv", "input (ln_1 output)", f"sbh*{e}", sbh * e)
    if not fused:
        # Grouped-query k/v are repeated to every head before the matmuls, so q, k, v are all sbh.
        add("attn.scores", "q and k", f"2sbh*{e}", 2 * sbh * e)
        if attention == "math":
            add("attn.scores", "causal mask (bool)", "s*s", s * s * BOOL)
        add("attn.softmax", "softmax output", f"as^2b*{sm}", a * s * s * b * sm)
        if drop:
            what, mb = mask(sm)
            add("attn.softmax", what, f"as^2b*{mb}", a * s * s * b * mb)
            add("attn.softmax", "dropout output", f"as^2b*{sm}", a * s * s * b * sm)
        if sm_cast:
            add("attn.av", "probabilities cast to 16-bit", f"as^2b*{sm_cast}", a * s * s * b * sm_cast)
        add("attn.av", "v", f"sbh*{e}", sbh * e)
        add("attn.proj", "input", f"sbh*{e}", sbh * e)
    else:
        add("attn.sdpa", "q, k, v", f"sb(h+2kv)*{e}", s * b * (h + 2 * kv) * e)
        add("attn.sdpa", "output (= attn.proj input)", f"sbh*{e}", sbh * e)
        add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
    if drop:
        what, mb = mask(e)
        add("attn.proj", what, f"sbh*{mb}", sbh * mb)
    add("ln_2", "input (residual stream)", f"sbh*{r}", sbh * r)
    add("ln_2", "mean/rstd (fp32)", f"{stats}*sb*4", stats * s * b * FP32)
    add("mlp.fc", "input (ln_2 output)", f"sbh*{e}", sbh * e)
    if shape.mlp == "gelu":
        add("mlp.act", "GELU input", f"sb*{f}*{e}", s * b * f * e)
    else:
        add("mlp.act", "gate and up outputs, SiLU output", f"3sb*{f}*{e}", 3 * s * b * f * e)
    add("mlp.proj", "input", f"sb*{f}*{e}", s * b * f * e)
    if drop:
        what, mb = mask(e)
        add("mlp.proj", what, f"sbh*{mb}", sbh * mb)
    if autocast:
        pp = _param_parts(shape)
        add("autocast", "16-bit weight copies", "2*layer matmul weights", 2 * pp.matmul_weights_per_layer)
    # Once: head and loss.
    add("ln_f", "input (residual stream)", f"sbh*{r}", sbh * r, per_layer=False)
    add("ln_f", "mean/rstd (fp32)", f"{stats}*sb*4", stats * s * b * FP32, per_layer=False)
    add("lm_head", "input (ln_f output)", f"sbh*{e}", sbh * e, per_layer=False)
    if autocast:
        add("lm_head", "16-bit weight copy", "2*V*h", 2 * v * h, per_layer=False)
    add("loss", "log-softmax output", f"sbV*{lp}", s * b * v * lp, per_layer=False)
    add("loss", "loss (scalar)", "4", FP32, per_layer=False)
    return items


# Hugging Face families whose saved tensors :func:`_hf_llama_items` itemizes (validated against
# measured CPU training steps in tests/test_models.py).
HF_LLAMA_LAYOUT = ("llama", "qwen2", "mistral", "phi3", "mixtral", "qwen2_moe")
HF_GPT2_LAYOUT = ("gpt2",)
HF_OTHER_LAYOUTS = ("gpt_neox", "opt", "falcon")
HF_ITEMIZED = HF_LLAMA_LAYOUT + HF_GPT2_LAYOUT + HF_OTHER_LAYOUTS + ("gemma2",)


def _hf_llama_items(shape: ModelShape, batch: int, seq_len: int, e: int) -> list[MemoryItem]:
    """Saved tensors of a Hugging Face Llama-layout decoder (RMSNorm, RoPE, SwiGLU, SDPA) in one dtype.

    Autograd keeps only what a backward formula needs: RoPE's ``q*cos + rotate_half(q)*sin`` keeps
    cos/sin (constants) but not q; SDPA without a mask takes grouped K/V as they are (no repeat), and
    its output reaches o_proj as a view. Each RMSNorm keeps its input upcast to fp32, the normalized
    tensor (before the weight) and its output (the next matmuls' input), plus fp32 rsqrt.
    Per layer: two RMSNorms, the rotated q and k, v, SDPA's output and log-sum-exp, and four
    d_ff-wide MLP tensors (gate, SiLU(gate), up, their product). Once: rotary cos/sin (one row of
    positions for the whole batch), the final norm, the cross-entropy's log-softmax and targets.
    Derived from transformers' Llama code and checked against measured CPU steps
    (tests/test_models.py).
    """
    s, b, d, a, f, v = seq_len, batch, shape.n_embd, shape.n_head, shape.ffn, shape.vocab_size
    qd, kv, hd = shape.q_dim, shape.kv_dim, shape.head_dim
    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True) -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer))

    def norm(block: str, per_layer: bool) -> None:
        add(block, "input upcast to fp32", "sbh*4", s * b * d * FP32, per_layer)
        add(block, "normalized (before the weight)", f"sbh*{e}", s * b * d * e, per_layer)
        add(block, "output (next matmul's input)", f"sbh*{e}", s * b * d * e, per_layer)
        add(block, "rsqrt (fp32)", "sb*4", s * b * FP32, per_layer)

    add("embedding", "rotary cos and sin (fp32)", "2*s*hd*4", 2 * s * hd * FP32, per_layer=False)
    norm("ln_1", True)
    add("attn.sdpa", "rotated q", f"sb*q_dim*{e}", s * b * qd * e)
    # transformers materialises a sliding-window mask once the keys reach the window; SDPA then gets
    # K/V repeated to every query head, and keeps a (b, 1, s, s) float mask per layer.
    masked = bool(shape.sliding_layers) and s >= (shape.sliding_window or 0)
    if masked:
        add("attn.sdpa", "k and v repeated to every head", f"2sb*q_dim*{e}", 2 * s * b * qd * e)
        add("attn.sdpa", "sliding-window mask (float)", f"b*s*s*{e}", b * s * s * e)
    else:
        add("attn.sdpa", "rotated k and v", f"2sb*kv_dim*{e}", 2 * s * b * kv * e)
    add("attn.sdpa", "output (= o_proj input)", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
    if shape.family == "phi3":  # Phi-3 reshapes the output with a copy before o_proj
        add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    norm("ln_2", True)
    if shape.moe:
        _moe_items(shape, s * b, e, add)
    else:
        add("mlp.act", "gate, SiLU(gate), up and their product", f"4sb*{f}*{e}", 4 * s * b * f * e)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def _moe_items(shape: ModelShape, n: int, e: int, add: Callable[..., None]) -> None:
    """Saved tensors of a Hugging Face MoE block run with eager experts (``experts_implementation="eager"``).

    Router: its fp32 softmax, top-k indices and renormalised weights. Each of the n x top_k routed
    token slots keeps its token index, the gathered input, the fused gate/up output, SiLU(gate), their
    product, its routing weight, the down projection's output and the weighted output. A shared
    expert (Qwen2-MoE) keeps a dense gated MLP's four tensors, its output and its sigmoid gate.
    """
    d, k, E = shape.n_embd, shape.top_k, shape.n_experts
    fe, fs = shape.expert_ffn, shape.shared_ffn
    add("mlp.fc", "router softmax (fp32), top-k indices (int64) and weights",
        "n*E*4 + n*k*(8+4) + n*4", n * E * FP32 + n * k * (INT64 + FP32) + n * FP32)
    add("mlp.fc", "per routed slot: index, input, gate/up, SiLU, product, weight, down output, weighted",
        f"n*k*((3d+4f_e)*{e} + 12)", n * k * ((3 * d + 4 * fe) * e + INT64 + FP32))
    if shape.n_shared_experts:
        add("mlp.act", "shared expert: gate, SiLU(gate), up, product; output; sigmoid gate",
            f"n*(4f_s+d+1)*{e}", n * (shape.n_shared_experts * 4 * fs + d + 1) * e)


def _hf_gemma2_items(shape: ModelShape, batch: int, seq_len: int, e: int) -> list[MemoryItem]:
    """Saved tensors of Hugging Face Gemma 2 (eager attention with logit soft-capping) in one dtype.

    Per layer: four RMSNorms (pre-attention and pre-MLP keep input, normalized and output; the two
    post-norms keep input and normalized), q and K repeated to every head for the score matmul, the
    tanh of the soft-capped scores and the softmax output (both b x h x s x s), V repeated, the
    o_proj input copy, and the GeGLU's four d_ff-wide tensors. Once: rotary cos/sin, the final
    norm, the tanh of the soft-capped logits, the log-softmax and targets.
    Read off autograd's saved tensors and checked against measured CPU steps (tests/test_models.py).
    """
    s, b, d, a, f, v = seq_len, batch, shape.n_embd, shape.n_head, shape.ffn, shape.vocab_size
    qd, hd = shape.q_dim, shape.head_dim
    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True) -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer))

    def norm(block: str, per_layer: bool, output: bool) -> None:
        add(block, "input and normalized", f"2sbh*{e}", 2 * s * b * d * e, per_layer)
        add(block, "rsqrt (fp32) and 1 + weight", "sb*4 + h*4", s * b * FP32 + d * FP32, per_layer)
        if output:
            add(block, "output (next matmul's input)", f"sbh*{e}", s * b * d * e, per_layer)

    add("embedding", "token ids (int64), rotary cos and sin (fp32)", "sb*8 + 2*s*hd*4",
        s * b * INT64 + 2 * s * hd * FP32, per_layer=False)
    norm("ln_1", True, output=True)
    add("attn.scores", "q, and k repeated to every head", f"2sb*q_dim*{e}", 2 * s * b * qd * e)
    add("attn.softmax", "tanh of the capped scores and the softmax output", f"2as^2b*{e}", 2 * a * s * s * b * e)
    add("attn.av", "v repeated to every head", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    norm("ln_1", True, output=False)  # post-attention norm
    norm("ln_2", True, output=True)
    add("mlp.act", "gate, GELU(gate), up and their product", f"4sb*{f}*{e}", 4 * s * b * f * e)
    norm("ln_2", True, output=False)  # post-feed-forward norm
    norm("ln_f", False, output=True)
    add("lm_head", "tanh of the soft-capped logits", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def _hf_gpt2_items(shape: ModelShape, batch: int, seq_len: int, e: int) -> list[MemoryItem]:
    """Saved tensors of Hugging Face's GPT-2 (LayerNorm, Conv1D, SDPA, the tanh "gelu_new") in one dtype.

    Per layer: each LayerNorm's input, mean/rstd and output; the fused c_attn output (k and v are views
    of it), a contiguous copy of q, SDPA's output and log-sum-exp, the contiguous c_proj input; the MLP's
    c_fc output plus the three tensors the composite ``0.5*x*(1+tanh(...))`` keeps (tanh, 0.5*x,
    1+tanh) and its output. Once: token ids, position ids, the final norm, the log-softmax and targets.
    Read off autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks) and checked against
    measured CPU steps (tests/test_models.py).
    """
    s, b, d, a, f, v = seq_len, batch, shape.n_embd, shape.n_head, shape.ffn, shape.vocab_size
    qd, kv = shape.q_dim, shape.kv_dim
    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True) -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer))

    def norm(block: str, per_layer: bool) -> None:
        add(block, "input (residual stream)", f"sbh*{e}", s * b * d * e, per_layer)
        add(block, "mean/rstd (fp32)", "2*sb*4", 2 * s * b * FP32, per_layer)
        add(block, "output (next matmul's input)", f"sbh*{e}", s * b * d * e, per_layer)

    add("embedding", "token and position ids (int64)", "sb*8 + s*8", s * b * INT64 + s * INT64, per_layer=False)
    norm("ln_1", True)
    add("attn.qkv", "c_attn output (k, v are views of it)", f"sb(q_dim+2kv)*{e}", s * b * (qd + 2 * kv) * e)
    add("attn.sdpa", "q (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.sdpa", "output", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
    add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    norm("ln_2", True)
    add("mlp.act", "c_fc output, tanh, 0.5*x, 1+tanh", f"4sb*{f}*{e}", 4 * s * b * f * e)
    add("mlp.proj", "input (GELU output)", f"sb*{f}*{e}", s * b * f * e)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def _hf_layernorm_items(shape: ModelShape, batch: int, seq_len: int, e: int) -> list[MemoryItem]:
    """Saved tensors of Hugging Face GPT-NeoX (Pythia), OPT and Falcon-7B-layout models in one dtype.

    Common: each LayerNorm keeps its input, mean/rstd and output (parallel blocks read one input);
    Falcon-40B (two parallel norms) runs SDPA with an explicit mask, kept per layer;
    attention keeps q, k, v as the kernel sees them, its output (SDPA: plus log-sum-exp) and, where the
    output reaches the projection through a copy, that copy; the MLP keeps the fc output and the
    activation's output (ReLU: only its output). Falcon-7B's attention runs as explicit batched
    matmuls: K and V broadcast to every head and the (b, h, s, s) probabilities are kept.
    Read off autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks) and checked against
    measured CPU steps (tests/test_models.py).
    """
    s, b, d, a, f, v = seq_len, batch, shape.n_embd, shape.n_head, shape.ffn, shape.vocab_size
    qd, kv, hd = shape.q_dim, shape.kv_dim, shape.head_dim
    fam = shape.family
    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True) -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer))

    def norm(block: str, per_layer: bool, with_input: bool = True) -> None:
        if with_input:
            add(block, "input (residual stream)", f"sbh*{e}", s * b * d * e, per_layer)
        add(block, "mean/rstd (fp32)", "2*sb*4", 2 * s * b * FP32, per_layer)
        add(block, "output (next matmul's input)", f"sbh*{e}", s * b * d * e, per_layer)

    ids = 2 if fam == "opt" else 1  # OPT also builds (b, s) int64 positions from the attention mask
    add("embedding", "token (and position) ids (int64)", f"{ids}*sb*8", ids * s * b * INT64, per_layer=False)
    if fam == "gpt_neox":
        add("embedding", "rotary cos and sin (fp32)", "2*s*rot*4", 2 * s * max(1, hd // 4) * FP32, per_layer=False)
    if fam == "falcon":
        add("embedding", "rotary cos and sin (fp32)", "2*s*hd*4", 2 * s * hd * FP32, per_layer=False)
    norm("ln_1", True)
    if fam == "falcon" and shape.norms_per_layer == 2:
        # Falcon-40B layout: SDPA with an explicit (b, 1, s, s) mask, K/V repeated to every head; the
        # two parallel LayerNorms share their input.
        add("ln_2", "mean/rstd (fp32)", "2*sb*4", 2 * s * b * FP32)
        add("ln_2", "output (MLP input)", f"sbh*{e}", s * b * d * e)
        add("attn.sdpa", "q, and k, v repeated to every head", f"3sb*q_dim*{e}", 3 * s * b * qd * e)
        add("attn.sdpa", "output (= dense input)", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
        add("attn.sdpa", "causal mask (float)", f"b*s*s*{e}", b * s * s * e)
    elif fam == "falcon":
        add("attn.scores", "q, and k broadcast to every head", f"2sb*q_dim*{e}", 2 * s * b * qd * e)
        add("attn.softmax", "probabilities", f"as^2b*{e}", a * s * s * b * e)
        add("attn.av", "v broadcast to every head", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.proj", "input", f"sb*q_dim*{e}", s * b * qd * e)
    else:
        add("attn.sdpa", "q, k, v", f"sb(q_dim+2kv)*{e}", s * b * (qd + 2 * kv) * e)
        add("attn.sdpa", "output", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
        if fam == "gpt_neox":
            add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    if shape.norms_per_layer > 1 and fam != "falcon":
        norm("ln_2", True, with_input=not shape.parallel)
    if shape.mlp == "relu":
        add("mlp.act", "ReLU output (= fc2 input)", f"sb*{f}*{e}", s * b * f * e)
    else:
        add("mlp.act", "fc output (GELU input)", f"sb*{f}*{e}", s * b * f * e)
        add("mlp.proj", "input (GELU output)", f"sb*{f}*{e}", s * b * f * e)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def _infer(
    shape: ModelShape, pp: _Params, batch: int, seq_len: int, kv_tokens: int, dtype: str, param_dtype: str,
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
    at_peak = {c: 0 for c in _AT_PEAK}
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
        parts={"prefill": dict(at_peak)},
    )


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, dtype_bytes: int) -> int:
    """2 (keys, values) x layers x kv_heads x head_dim x tokens x batch x bytes per element."""
    return 2 * shape.n_layer * shape.kv_heads * shape.head_dim * tokens * batch * dtype_bytes


def _impl(impl: str, device_kind: str) -> str:
    # torch picks foreach only when every tensor is on CUDA (or another accelerator); CPU loops.
    if impl == "auto":
        return "for-loop" if device_kind == "cpu" else "foreach"
    return impl


def _optimizer_temporaries(optimizer: str, impl: str, device_kind: str, pp: _Params, state_bytes: int) -> int:
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


def _validate(shape: ModelShape, batch: int, seq_len: int, mode: str, dtype: str, param_dtype: str, attention: str,
              optimizer: str, impl: str, dropout: float, new_tokens: int) -> None:
    if batch <= 0:
        raise ConfigError(f"batch size must be positive, got {batch}")
    if seq_len <= 0:
        raise ConfigError(f"sequence length must be positive, got {seq_len}")
    if mode not in ("train", "infer"):
        raise ConfigError(f"mode must be 'train' or 'infer', got {mode!r}")
    for name, val in (("dtype", dtype), ("param dtype", param_dtype)):
        if val not in DTYPE_BYTES:
            raise ConfigError(f"{name} must be one of {', '.join(DTYPE_BYTES)}, got {val!r}")
    if attention not in ("math", "sdpa"):
        raise ConfigError(f"attention must be 'math' or 'sdpa', got {attention!r}")
    if optimizer not in ("adamw", "sgd"):
        raise ConfigError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    if impl not in ("auto", "foreach", "for-loop", "fused"):
        raise ConfigError(f"optimizer implementation must be auto, foreach, for-loop or fused, got {impl!r}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
    if new_tokens < 0:
        raise ConfigError(f"new tokens must be >= 0, got {new_tokens}")
    tokens = seq_len + (new_tokens if mode == "infer" else 0)
    if tokens > shape.block_size:
        raise ConfigError(f"{tokens} tokens exceed the model's block_size {shape.block_size}")


def _regime(dtype: str, param_dtype: str, master_weights: bool, mode: str) -> str:
    """One line saying which precision regime the figures assume."""
    if param_dtype == "fp32" and dtype == "fp32":
        return "fp32: parameters, gradients, optimizer state and activations all fp32"
    if param_dtype == "fp32":
        if mode == "infer":
            return f"autocast {dtype}: fp32 parameters; matmuls in {dtype} on 16-bit weight copies"
        return (f"autocast {dtype}: fp32 parameters, gradients and optimizer state; matmuls in {dtype} on "
                "16-bit weight copies; residual stream, norms and loss in fp32")
    if mode == "infer":
        return f"{param_dtype} parameters, no autocast"
    if master_weights:
        return f"{param_dtype} parameters and gradients; fp32 master weights and fp32 moments in the optimizer"
    return f"{param_dtype} parameters, gradients and optimizer moments; no fp32 master copy"


def _name_bytes(dtype: str) -> str:
    return f"{DTYPE_BYTES[dtype]} B ({dtype})"


# -- fit search -------------------------------------------------------------------------------


def largest_fitting_batch(budget: int, estimate_at: Callable[[int], MemoryEstimate], limit: int = 1 << 20) -> int:
    """The largest batch size b with ``estimate_at(b).peak <= budget`` (0 when not even 1 fits).

    Peak memory grows with the batch size, so a doubling search then a bisection finds it in
    O(log b) estimates.
    """
    if estimate_at(1).peak > budget:
        return 0
    lo = 1
    hi = 2
    while hi <= limit and estimate_at(hi).peak <= budget:
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_at(mid).peak <= budget:
            lo = mid
        else:
            hi = mid
    return lo


# -- run record -------------------------------------------------------------------------------

# Run-record keys and the estimate attribute each one reads.
_KEYS = {
    "params": "params",
    "grads": "grads",
    "optimizer": "optimizer_state",
    "activations": None,  # saved tensors (+ held logits): what the forward pass leaves alive
    "kv_cache": "kv_cache",
    "peak": "peak",
}


def _estimated_value(est: MemoryEstimate, key: str) -> int:
    if key == "activations":
        if est.mode != "train":
            return 0
        return est.activations + (est.logits if est.hold_logits else 0)
    return int(getattr(est, str(_KEYS[key])))


def memory_metrics(estimate: MemoryEstimate, measured: "MeasuredMemory | None" = None) -> dict[str, "Metric"]:
    """Run-record metrics: ``memory.<x>`` (measured, n/a with a reason when not) and ``memory.estimated.<x>``.

    Keys: params, grads, optimizer, activations, kv_cache, peak. ``memory.activations`` is the
    allocated bytes at the end of the forward pass minus before it (held logits included).
    """
    from lmprof.record.run import Metric

    out: dict[str, Metric] = {}
    for key in _KEYS:
        if estimate.mode == "infer" and key in ("grads", "optimizer", "activations"):
            continue
        if estimate.mode == "train" and key == "kv_cache":
            continue
        out[f"memory.estimated.{key}"] = Metric(
            value=float(_estimated_value(estimate, key)), unit="B", source="estimated",
            note=_estimate_note(estimate, key),
        )
        out[f"memory.{key}"] = _measured_metric(measured, key)
    return out


def _estimate_note(est: MemoryEstimate, key: str) -> str | None:
    if key == "peak":
        return f"peak at {est.peak_at}; {est.regime}"
    if key == "activations":
        held = " + held logits" if est.hold_logits else ""
        return f"saved for backward{held} (Korthikanti et al. 2022, adapted)"
    if key == "optimizer":
        return est._optimizer_note()
    return None


def _measured_metric(measured: "MeasuredMemory | None", key: str) -> "Metric":
    from lmprof.record.run import Metric

    if measured is None:
        return Metric.na("B", "memory was not measured in this run")
    value, note = measured.value(key)
    if value is None:
        return Metric.na("B", note or "not measurable here")
    return Metric(value=float(value), unit="B", source="measured", note=note)


def memory_table(estimate: MemoryEstimate, measured: "MeasuredMemory | None" = None) -> list[dict[str, Any]]:
    """Rows for ``Run.tables["memory"]``: category, measured_bytes, estimated_bytes, diff_pct, note.

    ``diff_pct`` is (measured - estimated) / estimated in percent, None when either is missing.
    """
    rows: list[dict[str, Any]] = []
    keys = ["params", "grads", "optimizer", "activations", "peak"] if estimate.mode == "train" else [
        "params", "kv_cache", "peak"]
    for key in keys:
        est = _estimated_value(estimate, key)
        meas, note = (None, "not measured") if measured is None else measured.value(key)
        diff = None
        if meas is not None and est:
            diff = round(100.0 * (meas - est) / est, 2)
        rows.append({
            "category": key,
            "measured_bytes": None if meas is None else int(meas),
            "estimated_bytes": int(est),
            "diff_pct": diff,
            "note": note or _estimate_note(estimate, key) or "",
        })
    return rows


def format_bytes(n: float | None) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    if n is None:
        return "n/a"
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(abs(n), 1024)), 4)
    return f"{n / 1024 ** exp:.2f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][exp]}"
