"""Analytic FLOPs and minimum bytes moved, per block and phase, for a :class:`ModelShape`.

Nothing here runs a model: every count is a formula over the shape, the batch ``B``, the number of
new tokens ``T`` and the number of keys attended to ``S``. Block names are the canonical ones of
:mod:`lmprof.workloads.blocks`, so the numbers line up with measured block times.

Conventions are explicit (:class:`FlopConventions`) and printed with every result:

* a multiply-add is 2 FLOPs;
* attention scores and AV are counted for the full ``T x S`` matrix (PaLM appendix B, nanoGPT's
  ``estimate_mfu``) unless ``causal_attention`` is set, which counts only the attended pairs;
* the tied lm_head is counted once, as the lm_head matmul (the embedding gather is not a matmul);
* backward is 2x forward for matmuls (grad of the input and grad of the weight);
* non-matmul blocks (norms, softmax, activations, residual adds) get rough per-element costs
  (:data:`ELEMENTWISE_COSTS`, transcendentals counted as 1 FLOP) kept apart in ``other_flops`` so that
  matmul-only counters such as ``FlopCounterMode`` compare against ``matmul_flops``.

Bytes are the *minimum* traffic for each block run as one fused kernel: its inputs read once, its
outputs written once, its weights read once per pass, at the dtype's width. Intermediates inside a
block are not counted; tensors passed between blocks are (a written score matrix is read again by
the softmax). Decode reads the whole KV cache in attn.scores (K) and attn.av (V).

This module is pure Python: no torch import.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Literal

from lmprof.dtypes import DTYPE_BYTES, dtype_bytes, normalize_dtype, weight_bytes_per_param  # noqa: F401 - re-exported
from lmprof.errors import ConfigError
from lmprof.estimate.shape import ModelShape

Phase = Literal["forward", "backward", "prefill", "decode"]
PHASES: tuple[str, ...] = ("forward", "backward", "prefill", "decode")

# Rough FLOPs per element of the non-matmul work, transcendentals (exp, erf, rsqrt) as 1 FLOP.
# They only matter for placing memory-bound blocks on a roofline; MFU never uses them.
ELEMENTWISE_COSTS: dict[str, int] = {
    "layernorm": 7,  # mean (1), centre (1), square+sum (2), scale by rstd (1), gamma (1), beta (1)
    "rmsnorm": 4,  # square+sum (2), scale by rstd (1), gamma (1)
    "softmax": 5,  # max (1), subtract (1), exp (1), sum (1), divide (1)
    "scale_mask": 2,  # multiply by 1/sqrt(hs) (1), masked select (1), per score
    "gelu": 5,  # 0.5 * x * (1 + erf(x / sqrt 2)): 3 multiplies, erf, add
    "swiglu": 6,  # silu(g) = g * sigmoid(g) (neg, exp, add, divide, multiply = 5), times up (1)
    "rope": 3,  # x * cos + rotate(x) * sin, per element of q and k
    "add": 1,  # residual add, bias add, token + position embedding add
    "log_softmax": 5,  # max, subtract, exp, sum, log-subtract: the cross-entropy over the vocabulary
}

INDEX_BYTES = 8  # token ids and targets are int64 in PyTorch


@dataclass(frozen=True)
class FlopConventions:
    """The counting choices behind every FLOP and byte figure; :meth:`describe` prints them."""

    causal_attention: bool = False  # count only attended (q, k) pairs instead of the full T x S
    flops_per_mac: int = 2  # a multiply-add is 2 FLOPs; set 1 to count MACs
    backward_matmul_factor: float = 2.0  # grad wrt input + grad wrt weight, each a forward-sized matmul
    elementwise: bool = True  # count non-matmul blocks with ELEMENTWISE_COSTS; False zeroes them
    backward_elementwise_factor: float = 2.0  # rough: read saved input + grad, a few ops per element
    backward_bytes_factor: float = 2.0  # every forward read/write becomes a saved-tensor read + a grad read/write
    prefill_logits: Literal["last", "all"] = "last"  # the built-in GPT's inference path: last position only

    def __post_init__(self) -> None:
        if self.flops_per_mac not in (1, 2):
            raise ConfigError(f"flops_per_mac must be 1 or 2, got {self.flops_per_mac}")
        if self.prefill_logits not in ("last", "all"):
            raise ConfigError(f"prefill_logits must be 'last' or 'all', got {self.prefill_logits!r}")
        for name in ("backward_matmul_factor", "backward_elementwise_factor", "backward_bytes_factor"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")

    def describe(self) -> str:
        """One line per convention, for printing beside the numbers they produced."""
        attention = (
            "only attended (causal) q-k pairs" if self.causal_attention
            else "full T x S score matrix, causal mask not subtracted (PaLM / nanoGPT)"
        )
        other = (
            "non-matmul blocks at rough per-element costs "
            + ", ".join(f"{k} {v}" for k, v in ELEMENTWISE_COSTS.items())
            + " FLOP/element"
            if self.elementwise
            else "non-matmul blocks counted as 0 FLOPs"
        )
        return "\n".join(
            [
                f"multiply-add = {self.flops_per_mac} FLOP{'s' if self.flops_per_mac > 1 else ''}",
                f"attention: {attention}",
                "tied lm_head counted once (as the lm_head matmul; the embedding gather has no matmul FLOPs)",
                f"backward = {self.backward_matmul_factor:g} x forward for matmuls, "
                f"{self.backward_elementwise_factor:g} x for non-matmul work, "
                f"{self.backward_bytes_factor:g} x forward bytes",
                other,
                f"prefill logits: {'last position only' if self.prefill_logits == 'last' else 'every position'}",
                "bytes: minimum traffic per block (inputs read once, outputs written once, weights once per pass)",
            ]
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


DEFAULT_CONVENTIONS = FlopConventions()


def conventions_for(shape: ModelShape) -> FlopConventions:
    """The conventions that match how ``shape``'s model runs.

    The built-in GPT (family ``gpt`` or unset) computes prefill logits at the last position only;
    Hugging Face causal LMs called as ``model(input_ids)`` compute them at every prompt position.
    Change anything else with ``dataclasses.replace``.
    """
    logits: Literal["last", "all"] = "last" if shape.family in ("", "gpt") else "all"
    return FlopConventions(prefill_logits=logits)


@dataclass(frozen=True)
class BlockCost:
    """FLOPs and minimum bytes of one block in one phase, summed over its layers and the batch."""

    name: str
    phase: str
    matmul_flops: float
    other_flops: float
    weight_bytes: float
    act_bytes: float  # activations read + written
    kv_bytes: float = 0.0  # KV cache read (decode / prefill against a cache)
    count: int = 1  # how many instances were summed (n_layer for per-layer blocks)

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.other_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte (arithmetic intensity); inf when no bytes, 0 when no FLOPs."""
        if self.bytes <= 0:
            return float("inf") if self.flops > 0 else 0.0
        return self.flops / self.bytes

    def scaled(self, flops_matmul: float, flops_other: float, bytes_factor: float, phase: str) -> "BlockCost":
        return replace(
            self,
            phase=phase,
            matmul_flops=self.matmul_flops * flops_matmul,
            other_flops=self.other_flops * flops_other,
            weight_bytes=self.weight_bytes * bytes_factor,
            act_bytes=self.act_bytes * bytes_factor,
            kv_bytes=self.kv_bytes * bytes_factor,
        )

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.update(flops=self.flops, bytes=self.bytes, intensity=self.intensity)
        return d


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _attended_pairs(t_new: int, s: int, causal: bool) -> int:
    """(query, key) pairs per sequence per head: T x S, or only those the causal mask keeps.

    With a causal mask the i-th of the T new queries (at position S - T + i) sees S - T + i + 1 keys.
    """
    if not causal:
        return t_new * s
    return t_new * (s - t_new) + t_new * (t_new + 1) // 2


def expected_experts(shape: ModelShape, tokens: int) -> float:
    """Experts of one MoE layer that ``tokens`` tokens touch, on average, under uniform routing.

    Each token picks ``top_k`` of ``n_experts``; an expert is missed by all tokens with probability
    ``(1 - k/E)^tokens``. One decode token of Mixtral (top-2 of 8) reads 2 experts; 64 read ~8.
    """
    if not shape.moe:
        return 0.0
    e, k = shape.n_experts, shape.top_k
    return e * (1.0 - (1.0 - k / e) ** tokens)


@dataclass
class _Pass:
    """One pass's sizes, byte widths and attention counts, shared by the per-block formulas.

    ``w``: activation bytes per element; ``ww``: bytes per stored matmul weight; ``wkv``: KV cache
    bytes per element. ``T`` new tokens per sequence attend to ``S`` keys; ``n = B*T`` tokens.
    ``pairs``/``scores_elems``/``k_read`` are per layer (averaged when a sliding window caps some).
    """

    shape: ModelShape
    phase: str
    w: int
    ww: float
    wkv: int
    mac: int
    ew: int
    B: int
    L: int
    T: int
    S: int
    n: int
    pairs: float
    scores_elems: float
    k_read: float
    logit_rows: int
    from_cache: bool
    out: list[BlockCost] = field(default_factory=list)

    def add(self, name: str, count: int, matmul: float, other: float, weights: float, acts: float, kvb: float = 0.0,
            width: float | None = None) -> None:
        # weights and kvb are element counts (scaled by the weight / KV width here); acts is already
        # bytes because token ids are int64 whatever the model dtype.
        self.out.append(
            BlockCost(
                name=name, phase=self.phase, count=count,
                matmul_flops=float(count * matmul), other_flops=float(count * other * self.ew),
                weight_bytes=float(count * weights * (self.ww if width is None else width)),
                act_bytes=float(count * acts), kv_bytes=float(count * kvb * self.wkv),
            )
        )


def block_costs(
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    phase: str,
    dtype: object = "bf16",
    context: int | None = None,
    attention: Literal["math", "sdpa"] = "math",
    conventions: FlopConventions = DEFAULT_CONVENTIONS,
    weight_dtype: object | None = None,
    kv_dtype: object | None = None,
) -> list[BlockCost]:
    """Per-block FLOPs and minimum bytes of one pass, summed over layers and the batch.

    ``phase``:

    * ``forward``: training forward over ``batch`` x ``seq_len`` tokens, logits at every position, loss;
    * ``backward``: the matching backward (forward scaled by the conventions' backward factors);
    * ``prefill``: inference over ``seq_len`` prompt tokens, attending to ``context`` keys
      (default ``seq_len``: an empty KV cache), logits per ``conventions.prefill_logits``, no loss;
    * ``decode``: ONE new token per sequence attending to ``context`` keys (default ``seq_len``), the
      KV cache length after appending it; weights and the whole cache are read once.

    ``weight_dtype`` (default ``dtype``) is how matmul weights are stored: a float dtype or the
    weight-only int8 / int4 formats (with a 2-byte scale per group of 128); ``kv_dtype`` (default
    ``dtype``) the KV cache's element type. Both change bytes only: the matmuls run in ``dtype``.
    Mixture-of-experts MLPs count ``top_k`` experts per token (plus shared experts and the router)
    and read the weights of the experts the batch's tokens touch (:func:`expected_experts`).
    Layers with a sliding window attend to at most the window's keys in decode (a windowed cache);
    prefill and training count the full masked ``T x S`` matrix, which is what eager and SDPA
    attention compute. ``attention="sdpa"`` replaces attn.scores/softmax/av by one fused attn.sdpa
    block (no T x S tensor in memory). Blocks are returned in data-flow order.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    if phase not in PHASES:
        raise ConfigError(f"unknown phase {phase!r}: use one of {', '.join(PHASES)}")
    if attention not in ("math", "sdpa"):
        raise ConfigError(f"attention must be 'math' or 'sdpa', got {attention!r}")
    if phase == "backward":
        fwd = block_costs(
            shape, batch=batch, seq_len=seq_len, phase="forward", dtype=dtype,
            attention=attention, conventions=conventions, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
        )
        return _backward_of(fwd, conventions)
    p = _pass_sizes(shape, batch, seq_len, phase, dtype, context, conventions, weight_dtype, kv_dtype)
    _input_blocks(p)
    if attention == "math":
        _math_attention_blocks(p)
    else:
        _sdpa_attention_block(p)
    _attention_output_blocks(p)
    if shape.n_moe_layers:
        _moe_mlp_blocks(p, shape.n_moe_layers)
    if L_dense := shape.n_layer - shape.n_moe_layers:
        _dense_mlp_blocks(p, L_dense)
    _head_blocks(p)
    return _merged(p.out)


def _merged(costs: list[BlockCost]) -> list[BlockCost]:
    """One entry per block name: an MoE model's dense and MoE layers' MLP blocks added up (first one's place)."""
    out: dict[str, BlockCost] = {}
    for c in costs:
        t = out.get(c.name)
        out[c.name] = c if t is None else replace(
            t, matmul_flops=t.matmul_flops + c.matmul_flops, other_flops=t.other_flops + c.other_flops,
            weight_bytes=t.weight_bytes + c.weight_bytes, act_bytes=t.act_bytes + c.act_bytes,
            kv_bytes=t.kv_bytes + c.kv_bytes, count=t.count + c.count)
    return list(out.values())


def _backward_of(forward: list[BlockCost], c: FlopConventions) -> list[BlockCost]:
    """The backward pass's blocks: each forward block scaled by the conventions' backward factors."""
    return [
        b.scaled(c.backward_matmul_factor, c.backward_elementwise_factor, c.backward_bytes_factor, "backward")
        for b in forward
    ]


def _pass_sizes(
    shape: ModelShape, batch: int, seq_len: int, phase: str, dtype: object, context: int | None,
    conventions: FlopConventions, weight_dtype: object | None, kv_dtype: object | None,
) -> _Pass:
    """The sizes every block formula reads, for one forward, prefill or decode pass."""
    # Widths first: an unknown dtype is reported before a bad context, as it always was.
    w = dtype_bytes(dtype)
    ww = weight_bytes_per_param(weight_dtype if weight_dtype is not None else dtype)
    wkv = dtype_bytes(kv_dtype if kv_dtype is not None else dtype)
    B, L = batch, shape.n_layer
    # Width of K (and of V) per token as cached; MLA caches one latent per token, half counted as K, half as V.
    kv = shape.kv_width / 2
    T = 1 if phase == "decode" else seq_len  # new tokens per sequence
    if phase == "forward":
        S = T
    else:
        S = context if context is not None else seq_len
        _check_positive(context=S)
        if S < T:
            raise ConfigError(f"context ({S}) must be at least the number of new tokens ({T})")
    n = B * T  # tokens processed
    # Keys each layer attends to: a sliding window caps them in decode (see block_costs).
    keys = [shape.attended(i, S) if phase == "decode" else S for i in range(L)]
    pairs_sum = sum(B * _attended_pairs(T, k, conventions.causal_attention) for k in keys)  # per head
    pairs = pairs_sum / L  # per layer, on average
    if phase == "forward" or (phase == "prefill" and conventions.prefill_logits == "all"):
        logit_rows = n
    else:  # decode, or prefill keeping only the last position's logits (the built-in GPT)
        logit_rows = B
    return _Pass(
        shape=shape, phase=phase,
        w=w, ww=ww, wkv=wkv, mac=conventions.flops_per_mac, ew=1 if conventions.elementwise else 0,
        B=B, L=L, T=T, S=S, n=n, pairs=pairs,
        scores_elems=shape.n_head * pairs,  # elements of the (B, h, T, S) score matrix actually computed
        k_read=B * sum(keys) / L * kv,  # K (or V) elements of the attended positions, per layer
        logit_rows=logit_rows,
        # K and V of the S attended positions come from the KV cache when decoding / prefilling against one.
        from_cache=phase == "decode" or (phase == "prefill" and S > T),
    )


def _norm_cost(shape: ModelShape) -> float:
    return ELEMENTWISE_COSTS["rmsnorm"] if shape.norm == "rmsnorm" else ELEMENTWISE_COSTS["layernorm"]


def _input_blocks(p: _Pass) -> None:
    """embedding, ln_1 and the q/k/v projection (with RoPE)."""
    shape, cost, w, n, L, T = p.shape, ELEMENTWISE_COSTS, p.w, p.n, p.L, p.T
    d, qd, kv = shape.n_embd, shape.q_dim, shape.kv_dim
    qkv_bias = 1 if shape.has_qkv_bias and not shape.mla else 0
    # embedding: gather token rows (+ position rows) and add them.
    pos_rows = T * d if shape.pos == "learned" else 0
    p.add(
        "embedding", 1, 0, n * d * cost["add"] if shape.pos == "learned" else 0,
        n * d + pos_rows, n * INDEX_BYTES + n * d * w, width=w,
    )
    # Norms before attention (ln_1) and before the MLP (ln_2); Gemma 2 adds a norm after each.
    n_ln1 = 2 if shape.norms_per_layer == 4 else 1
    p.add("ln_1", n_ln1 * L, 0, _norm_cost(shape) * n * d, shape.norm_params(), 2 * n * d * w, width=w)
    qkv_out, weights = shape.qkv_out(), shape.qkv_weights()
    rope = cost["rope"] * n * (qd + kv) if shape.pos == "rope" else 0
    matmul = p.mac * n * weights
    if shape.mla and p.from_cache:
        # Hugging Face's MLA expands every cached latent through kv_b_proj again at each step.
        kv_b = (shape.kv_lora_rank or 0) * shape.n_head * (shape.head_dim - shape.qk_rope_head_dim + shape.v_head_dim)
        matmul += p.mac * kv_b * (p.B * p.S - n)
    p.add(
        "attn.qkv", L, matmul, qkv_bias * n * qkv_out + rope,
        weights + qkv_bias * qkv_out, (n * d + n * qkv_out) * w,
    )


def _math_attention_blocks(p: _Pass) -> None:
    """attn.scores, attn.softmax and attn.av as separate kernels (the T x S scores go through memory)."""
    cost, w, n, L, mac, qd, vd = ELEMENTWISE_COSTS, p.w, p.n, p.L, p.mac, p.shape.q_dim, p.shape.v_dim
    pairs, scores_elems, k_read, from_cache = p.pairs, p.scores_elems, p.k_read, p.from_cache
    p.add(
        "attn.scores", L, mac * pairs * qd, cost["scale_mask"] * scores_elems, 0,
        (n * qd + (0 if from_cache else k_read) + scores_elems) * w, k_read if from_cache else 0,
    )
    p.add("attn.softmax", L, 0, cost["softmax"] * scores_elems, 0, 2 * scores_elems * w)
    p.add(
        "attn.av", L, mac * pairs * vd, 0, 0,
        (scores_elems + (0 if from_cache else k_read) + n * vd) * w, k_read if from_cache else 0,
    )


def _sdpa_attention_block(p: _Pass) -> None:
    """One fused attn.sdpa block: no T x S tensor in memory."""
    cost, w, n, L, mac, qd = ELEMENTWISE_COSTS, p.w, p.n, p.L, p.mac, p.shape.q_dim
    pairs, scores_elems, k_read, from_cache = p.pairs, p.scores_elems, p.k_read, p.from_cache
    p.add(
        "attn.sdpa", L, mac * pairs * (qd + p.shape.v_dim), (cost["scale_mask"] + cost["softmax"]) * scores_elems, 0,
        (n * qd + (0 if from_cache else 2 * k_read) + n * qd) * w, 2 * k_read if from_cache else 0,
    )


def _attention_output_blocks(p: _Pass) -> None:
    """attn.proj, the two residual adds of a layer, and ln_2 (where the layout has one)."""
    shape, cost, w, n, L = p.shape, ELEMENTWISE_COSTS, p.w, p.n, p.L
    d, vd = shape.n_embd, shape.v_dim
    bias = 1 if shape.has_o_bias else 0
    p.add("attn.proj", L, p.mac * n * vd * d, bias * n * d, vd * d + bias * d, (n * vd + n * d) * w)
    p.add("residual", 2 * L, 0, cost["add"] * n * d, 0, 3 * n * d * w)
    if shape.norms_per_layer > 1:
        p.add("ln_2", (2 if shape.norms_per_layer == 4 else 1) * L, 0, _norm_cost(shape) * n * d, shape.norm_params(),
              2 * n * d * w, width=w)


def _dense_mlp_blocks(p: _Pass, L: int) -> None:
    """mlp.fc (gate and up projections both belong to it), the activation and mlp.proj, in ``L`` layers."""
    shape, w, n, mac = p.shape, p.w, p.n, p.mac
    d, f = shape.n_embd, shape.ffn
    bias = 1 if shape.bias else 0
    gate = 2 if shape.gated else 1
    act = ELEMENTWISE_COSTS["swiglu"] if shape.gated else ELEMENTWISE_COSTS["gelu"]
    p.add("mlp.fc", L, mac * n * d * gate * f, gate * bias * n * f, gate * d * f + gate * bias * f,
          (n * d + gate * n * f) * w)
    p.add("mlp.act", L, 0, act * n * f, 0, (gate + 1) * n * f * w)
    p.add("mlp.proj", L, mac * n * f * d, bias * n * d, f * d + bias * d, (n * f + n * d) * w)


def _moe_mlp_blocks(p: _Pass, L: int) -> None:
    """A mixture-of-experts MLP in ``L`` layers, as the rows a measured run has: moe.router (d -> E),
    moe.experts (top_k routed experts per token: their up/gate and down projections), mlp.act (every
    expert's activation), and the shared experts as a dense MLP (mlp.fc with their sigmoid gate, mlp.proj)."""
    shape, w, n, mac = p.shape, p.w, p.n, p.mac
    d, E = shape.n_embd, shape.n_experts
    gate = 2 if shape.gated else 1
    act = ELEMENTWISE_COSTS["swiglu"] if shape.gated else ELEMENTWISE_COSTS["gelu"]
    fe, fs, k, ns = shape.expert_ffn, shape.shared_ffn, shape.top_k, shape.n_shared_experts
    touched = expected_experts(shape, n)
    sgate = d if (ns and shape.shared_expert_gate) else 0
    # Expert and router biases (gpt-oss): one add per output element, their weights read like the experts'.
    bias = 1 if shape.bias else 0
    router_bias = E if shape.router_bias else 0
    p.add("moe.router", L, mac * n * d * E, n * router_bias, d * E + router_bias, (n * d + n * E) * w)
    p.add("moe.experts", L, mac * n * d * k * gate * fe + mac * n * k * fe * d, n * bias * (gate * k * fe + k * d),
          touched * (gate * d * fe + fe * d) + bias * touched * (gate * fe + d),
          (n * d + gate * n * k * fe + n * k * fe + n * d) * w)
    p.add("mlp.act", L, 0, act * n * (k * fe + ns * fs), 0, (gate + 1) * n * (k * fe + ns * fs) * w)
    if ns or sgate:
        p.add("mlp.fc", L, mac * n * d * ns * gate * fs + mac * n * sgate, 0, ns * gate * d * fs + sgate,
              (n * d + gate * n * ns * fs) * w)
    if ns:
        p.add("mlp.proj", L, mac * n * ns * fs * d, 0, ns * fs * d, (n * ns * fs + n * d) * w)


def _head_blocks(p: _Pass) -> None:
    """ln_f, lm_head (every position or the last, see :class:`FlopConventions`) and, in training, the loss."""
    shape, cost, w, n = p.shape, ELEMENTWISE_COSTS, p.w, p.n
    d, V, rows = shape.n_embd, shape.vocab_size, p.logit_rows
    p.add("ln_f", 1, 0, _norm_cost(shape) * n * d, shape.norm_params(), 2 * n * d * w, width=w)
    head_bias = 1 if shape.head_bias else 0
    p.add("lm_head", 1, p.mac * rows * d * V, head_bias * rows * V, V * d + head_bias * V, (rows * d + rows * V) * w)
    if p.phase == "forward":
        p.add("loss", 1, 0, (cost["log_softmax"] * V + 1) * n, 0, n * V * w + n * INDEX_BYTES + w)


def phase_costs(
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    phase: str,
    dtype: object = "bf16",
    decode_tokens: int = 1,
    attention: Literal["math", "sdpa"] = "math",
    conventions: FlopConventions = DEFAULT_CONVENTIONS,
    weight_dtype: object | None = None,
    kv_dtype: object | None = None,
    checkpointing: bool = False,
) -> list[BlockCost]:
    """Block costs of a whole phase as lmprof records it.

    ``train`` gives forward + backward blocks (with ``checkpointing``, the transformer layers'
    forward blocks a second time, phase ``recompute``: full activation checkpointing); ``decode`` sums ``decode_tokens`` steps after a
    ``seq_len``-token prompt (step i attends to ``seq_len + i`` keys); other phases are one pass.
    """

    def one_pass(pass_phase: str, tokens: int) -> list[BlockCost]:
        return block_costs(shape, batch=batch, seq_len=tokens, phase=pass_phase, dtype=dtype, attention=attention,
                           conventions=conventions, weight_dtype=weight_dtype, kv_dtype=kv_dtype)

    if phase == "train":
        recomputed = []
        if checkpointing:  # full activation checkpointing re-runs every layer's forward in backward
            recomputed = [replace(c, phase="recompute") for c in one_pass("forward", seq_len)
                          if c.name not in ("embedding", "ln_f", "lm_head", "loss")]
        return [*one_pass("forward", seq_len), *recomputed, *one_pass("backward", seq_len)]
    if phase != "decode":
        return one_pass(phase, seq_len)
    _check_positive(decode_tokens=decode_tokens)
    steps = [one_pass("decode", seq_len + i) for i in range(1, decode_tokens + 1)]
    return sum_costs(steps)


def sum_costs(passes: Iterable[list[BlockCost]]) -> list[BlockCost]:
    """Add several passes block by block (same names and phases, first pass's order)."""
    total: dict[tuple[str, str], BlockCost] = {}
    for costs in passes:
        for b in costs:
            key = (b.name, b.phase)
            if key not in total:
                total[key] = b
            else:
                t = total[key]
                total[key] = replace(
                    t,
                    matmul_flops=t.matmul_flops + b.matmul_flops,
                    other_flops=t.other_flops + b.other_flops,
                    weight_bytes=t.weight_bytes + b.weight_bytes,
                    act_bytes=t.act_bytes + b.act_bytes,
                    kv_bytes=t.kv_bytes + b.kv_bytes,
                )
    return list(total.values())


def totals(costs: Iterable[BlockCost]) -> dict[str, float]:
    """Sum of matmul FLOPs, all FLOPs and bytes over blocks."""
    costs = list(costs)
    return {
        "matmul_flops": sum(b.matmul_flops for b in costs),
        "flops": sum(b.flops for b in costs),
        "bytes": sum(b.bytes for b in costs),
    }


# -- model-level FLOPs (MFU) ------------------------------------------------------------------------

# A training token costs three forwards: the forward, and a backward of two forward-sized matmuls.
_FORWARDS_PER_TOKEN = {"train": 3, "forward": 1}


def model_flops_per_token(
    shape: ModelShape,
    seq_len: int,
    mode: Literal["train", "forward"] = "train",
    conventions: FlopConventions = DEFAULT_CONVENTIONS,
) -> float:
    """FLOPs per token: ``6N + 12·L·H·Q·T`` (train) or ``2N + 4·L·H·Q·T`` (forward only).

    N is the non-embedding parameter count as nanoGPT counts it (position embeddings out, the tied
    token embedding in, since it is the lm_head's weight), the *active* parameters for a mixture of
    experts (top_k experts per token); H·Q = n_head x head_dim (n_embd except when the head size is
    set apart, Gemma 2); T is the number of keys each token attends to. From the PaLM paper's
    appendix B, as used by nanoGPT's ``estimate_mfu``. With ``causal_attention`` the attention term
    uses the average (T + 1) / 2 attended keys instead of T.
    """
    _check_positive(seq_len=seq_len)
    if mode not in _FORWARDS_PER_TOKEN:
        raise ConfigError(f"mode must be 'train' or 'forward', got {mode!r}")
    n = shape.n_params_non_embedding(active=True)
    keys = (seq_len + 1) / 2 if conventions.causal_attention else seq_len
    mac = conventions.flops_per_mac
    # forward: mac per weight (the matmul), the scores (T·q_dim) and AV (T·v_dim) matmuls per layer
    fwd = mac * n + mac * shape.n_layer * (shape.q_dim + shape.v_dim) * keys
    return _FORWARDS_PER_TOKEN[mode] * fwd


def model_flops_per_step(
    shape: ModelShape,
    *,
    batch: int,
    seq_len: int,
    mode: Literal["train", "prefill", "decode"],
    decode_tokens: int = 1,
    conventions: FlopConventions = DEFAULT_CONVENTIONS,
) -> float:
    """Model FLOPs of one training step, one prefill, or ``decode_tokens`` decode steps.

    * train: ``B·T·(6N + 12·L·d·T)``;
    * prefill: ``B·T·(2N + 4·L·d·T)``, minus the lm_head of the ``T - 1`` positions whose logits are
      not computed when ``conventions.prefill_logits == "last"``;
    * decode: sum over steps i = 1..n of ``B·(2N + 4·L·d·(T + i))``: one token per sequence
      attending to the prompt ``T`` plus the i tokens generated so far (the new one included); a
      layer with a sliding window attends to at most the window.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    if mode == "train":
        return batch * seq_len * model_flops_per_token(shape, seq_len, "train", conventions)
    if mode == "prefill":
        total = batch * seq_len * model_flops_per_token(shape, seq_len, "forward", conventions)
        if conventions.prefill_logits == "last":
            total -= conventions.flops_per_mac * shape.n_embd * shape.vocab_size * batch * (seq_len - 1)
        return total
    if mode == "decode":
        _check_positive(decode_tokens=decode_tokens)
        mac = conventions.flops_per_mac
        weights = mac * shape.n_params_non_embedding(active=True) * decode_tokens
        # A single new query attends to every cached key, so the causal convention changes nothing.
        if shape.sliding_layers:
            contexts = sum(shape.attended(layer, seq_len + i) for i in range(1, decode_tokens + 1)
                           for layer in range(shape.n_layer)) / shape.n_layer
        else:  # linear in the context: sum it in closed form
            contexts = decode_tokens * seq_len + decode_tokens * (decode_tokens + 1) / 2
        attn = mac * shape.n_layer * (shape.q_dim + shape.v_dim) * contexts
        return batch * (weights + attn)
    raise ConfigError(f"mode must be train, prefill or decode, got {mode!r}")
