"""Saved-for-backward tensors of the Hugging Face families (Llama layout and MoE, Gemma 2, GPT-2, LayerNorm models).

Each itemization was read off autograd's saved tensors and is checked against measured CPU training
steps in tests/test_models.py.
"""
from __future__ import annotations

from typing import Callable

from lmprof.estimate.families import with_
from lmprof.estimate.memory.result import FP32, INT64, MemoryItem
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.dropout import Dropout

NO_DROPOUT = Dropout()
Add = Callable[..., None]

# Hugging Face families whose saved tensors each itemization covers (validated against measured CPU
# training steps in tests/test_models.py): the ``layout`` of their records (estimate/families.py).
HF_LLAMA_LAYOUT = with_("layout", "llama")
HF_GPT2_LAYOUT = with_("layout", "gpt2")
HF_OTHER_LAYOUTS = with_("layout", "layernorm")
HF_ITEMIZED = HF_LLAMA_LAYOUT + HF_GPT2_LAYOUT + HF_OTHER_LAYOUTS + with_("layout", "gemma2")


def _math_sdpa(add: Add, shape: ModelShape, s: int, b: int, e: int, p: float, mask_bytes: int) -> None:
    """What SDPA's math kernel keeps (the CPU's path whenever attention dropout is on).

    It scales q and k before their matmul, so both are new tensors, with k (and v) repeated to every
    query head; the probabilities (and, with dropout, the mask and the dropped probabilities, which
    the matmul with v saves); v as that matmul's operand. Its output reaches the projection through
    a copy (heads back to the hidden dimension), which the projection keeps. Read off autograd's
    saved tensors (tests/test_models.py checks the total against measured steps).
    """
    qd, a = shape.q_dim, shape.n_head
    add("attn.scores", "q and k, scaled (k repeated to every head)", f"2sb*q_dim*{e}", 2 * s * b * qd * e)
    add("attn.softmax", "probabilities", f"as^2b*{e}", a * s * s * b * e)
    _attention_dropout(add, shape, s, b, e, p, mask_bytes)
    add("attn.av", "v (repeated to every head)", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.proj", "input (copy of the heads)", f"sb*q_dim*{e}", s * b * qd * e)


def _attention_dropout(add: Add, shape: ModelShape, s: int, b: int, e: int, p: float, mask_bytes: int) -> None:
    """Dropout on the (b, a, s, s) probabilities: its mask and the dropped probabilities."""
    if p:
        a = shape.n_head
        add("attn.softmax", "dropout mask on the probabilities", f"as^2b*{mask_bytes}", a * s * s * b * mask_bytes)
        add("attn.softmax", "dropped probabilities", f"as^2b*{e}", a * s * s * b * e)


def _branch_dropout(add: Add, shape: ModelShape, s: int, b: int, drop: Dropout, mask_bytes: int,
                    branches: int = 2) -> None:
    """Masks of the dropouts on the branch outputs (attention, MLP), inside the MLP and on the embeddings."""
    sbh = s * b * shape.n_embd
    if drop.residual:
        add("attn.proj", "dropout mask on the branch output", f"sbh*{mask_bytes}", sbh * mask_bytes)
        if branches == 2:
            add("mlp.proj", "dropout mask on the branch output", f"sbh*{mask_bytes}", sbh * mask_bytes)
    if drop.activation:
        f = shape.ffn
        add("mlp.act", "dropout mask after the activation", f"sb*{f}*{mask_bytes}", s * b * f * mask_bytes)
    if drop.embedding:
        add("embedding", "dropout mask on the embeddings", f"sbh*{mask_bytes}", sbh * mask_bytes, per_layer=False)


def hf_llama_items(shape: ModelShape, batch: int, seq_len: int, e: int, *, fused: bool = True,
                   dropout: Dropout = NO_DROPOUT, mask_bytes: int = 0) -> list[MemoryItem]:
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
    if fused:
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
    else:
        _math_sdpa(add, shape, s, b, e, dropout.attention, mask_bytes)
    norm("ln_2", True)
    if shape.moe:
        _moe_items(shape, s * b, e, add)
    else:
        add("mlp.act", "gate, SiLU(gate), up and their product", f"4sb*{f}*{e}", 4 * s * b * f * e)
    _branch_dropout(add, shape, s, b, dropout, mask_bytes)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def _moe_items(shape: ModelShape, n: int, e: int, add: Add) -> None:
    """Saved tensors of a Hugging Face MoE block run with eager experts (``experts_implementation="eager"``).

    Router: its fp32 softmax, top-k indices and renormalised weights. Each of the n x top_k routed
    token slots keeps its token index, the gathered input, the fused gate/up output, SiLU(gate), their
    product, its routing weight, the down projection's output and the weighted output. A shared
    expert (Qwen2-MoE) keeps a dense gated MLP's four tensors, its output and its sigmoid gate.
    """
    d, k, E = shape.n_embd, shape.top_k, shape.n_experts
    fe, fs = shape.expert_ffn, shape.shared_ffn
    add("moe.router", "router softmax (fp32), top-k indices (int64) and weights",
        "n*E*4 + n*k*(8+4) + n*4", n * E * FP32 + n * k * (INT64 + FP32) + n * FP32)
    add("moe.experts", "per routed slot: index, input, gate/up, SiLU, product, weight, down output, weighted",
        f"n*k*((3d+4f_e)*{e} + 12)", n * k * ((3 * d + 4 * fe) * e + INT64 + FP32))
    if shape.n_shared_experts:
        add("mlp.act", "shared expert: gate, SiLU(gate), up, product; output; sigmoid gate",
            f"n*(4f_s+d+1)*{e}", n * (shape.n_shared_experts * 4 * fs + d + 1) * e)


def hf_gemma2_items(shape: ModelShape, batch: int, seq_len: int, e: int, *, fused: bool = True,
                    dropout: Dropout = NO_DROPOUT, mask_bytes: int = 0) -> list[MemoryItem]:
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
    _attention_dropout(add, shape, s, b, e, dropout.attention, mask_bytes)
    add("attn.av", "v repeated to every head", f"sb*q_dim*{e}", s * b * qd * e)
    add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    norm("ln_1", True, output=False)  # post-attention norm
    norm("ln_2", True, output=True)
    add("mlp.act", "gate, GELU(gate), up and their product", f"4sb*{f}*{e}", 4 * s * b * f * e)
    norm("ln_2", True, output=False)  # post-feed-forward norm
    _branch_dropout(add, shape, s, b, dropout, mask_bytes)
    norm("ln_f", False, output=True)
    add("lm_head", "tanh of the soft-capped logits", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def hf_gpt2_items(shape: ModelShape, batch: int, seq_len: int, e: int, *, fused: bool = True,
                  dropout: Dropout = NO_DROPOUT, mask_bytes: int = 0) -> list[MemoryItem]:
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
    if fused:
        add("attn.qkv", "c_attn output (k, v are views of it)", f"sb(q_dim+2kv)*{e}", s * b * (qd + 2 * kv) * e)
        add("attn.sdpa", "q (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.sdpa", "output", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
        add("attn.proj", "input (contiguous copy)", f"sb*q_dim*{e}", s * b * qd * e)
    else:
        _math_sdpa(add, shape, s, b, e, dropout.attention, mask_bytes)
    norm("ln_2", True)
    add("mlp.act", "c_fc output, tanh, 0.5*x, 1+tanh", f"4sb*{f}*{e}", 4 * s * b * f * e)
    add("mlp.proj", "input (GELU output)", f"sb*{f}*{e}", s * b * f * e)
    _branch_dropout(add, shape, s, b, dropout, mask_bytes)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items


def hf_layernorm_items(shape: ModelShape, batch: int, seq_len: int, e: int, *, fused: bool = True,
                       dropout: Dropout = NO_DROPOUT, mask_bytes: int = 0) -> list[MemoryItem]:
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
    falcon40 = fam == "falcon" and shape.norms_per_layer == 2
    if falcon40:  # Falcon-40B layout: the two parallel LayerNorms share their input
        add("ln_2", "mean/rstd (fp32)", "2*sb*4", 2 * s * b * FP32)
        add("ln_2", "output (MLP input)", f"sbh*{e}", s * b * d * e)
    if not fused and (fam != "falcon" or falcon40):
        _math_sdpa(add, shape, s, b, e, dropout.attention, mask_bytes)
    elif falcon40:
        # SDPA with an explicit (b, 1, s, s) mask, K/V repeated to every head.
        add("attn.sdpa", "q, and k, v repeated to every head", f"3sb*q_dim*{e}", 3 * s * b * qd * e)
        add("attn.sdpa", "output (= dense input)", f"sb*q_dim*{e}", s * b * qd * e)
        add("attn.sdpa", "log-sum-exp (fp32)", "asb*4", a * s * b * FP32)
        add("attn.sdpa", "causal mask (float)", f"b*s*s*{e}", b * s * s * e)
    elif fam == "falcon":
        add("attn.scores", "q, and k broadcast to every head", f"2sb*q_dim*{e}", 2 * s * b * qd * e)
        add("attn.softmax", "probabilities", f"as^2b*{e}", a * s * s * b * e)
        _attention_dropout(add, shape, s, b, e, dropout.attention, mask_bytes)
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
    # Falcon's parallel block drops the sum of its two branches once.
    _branch_dropout(add, shape, s, b, dropout, mask_bytes, branches=1 if fam == "falcon" and shape.parallel else 2)
    norm("ln_f", False)
    add("loss", "log-softmax output", f"sbV*{e}", s * b * v * e, per_layer=False)
    add("loss", "shifted targets (int64)", "sb*8", s * b * INT64, per_layer=False)
    return items
