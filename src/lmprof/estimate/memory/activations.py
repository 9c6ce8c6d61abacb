"""Saved-for-backward tensors of the built-in GPT, and the dispatch to the Hugging Face itemizations."""
from __future__ import annotations

from lmprof.estimate.families import family
from lmprof.estimate.memory.hf_activations import (
    hf_gemma2_items,
    hf_gpt2_items,
    hf_layernorm_items,
    hf_llama_items,
)
from lmprof.estimate.memory.params import param_parts
from lmprof.estimate.memory.result import BOOL, DTYPE_BYTES, FP32, INT64, MemoryItem
from lmprof.estimate.memory.step import TrainStep
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.sdpa_path import sdpa_path


def activation_items(shape: ModelShape, step: TrainStep) -> list[MemoryItem]:
    """The tensors the forward pass saves for backward, block by block (bytes per layer or once).

    Paper terms (16-bit, per layer): layer-norm inputs 4sbh, QKV input 2sbh, Q and K 4sbh, softmax
    output 2as^2b, its dropout mask as^2b and output 2as^2b, V 2sbh, projection input 2sbh and
    dropout mask sbh; MLP inputs 2sbh + 8sbh, GELU input 8sbh, dropout mask sbh.
    ``step.dropout``: one rate for the built-in GPT, or the rates by site (Hugging Face configs). With
    ``attention="sdpa"`` the kernel that runs (fused or math) follows PyTorch's selection rule
    (:func:`lmprof.estimate.sdpa_path.sdpa_path`): on the CPU, attention dropout means math.
    """
    batch, seq_len, dtype, param_dtype = step.batch, step.seq_len, step.dtype, step.param_dtype
    attention, device_kind, drops = step.attention, step.device_kind, step.drops
    fused = attention == "sdpa" and sdpa_path(device_kind, dtype, drops.attention) == "fused"
    rec = family(shape.family)
    layout = rec.layout if rec is not None else ""
    if layout and dtype == param_dtype and (attention == "sdpa" or layout == "gemma2"):  # transformers runs Gemma 2 eager
        e = DTYPE_BYTES[param_dtype]
        # CPU dropout keeps its scaled mask in the input's dtype; CUDA's fused dropout a bool mask.
        mask_b = e if device_kind == "cpu" else BOOL
        itemize = {"llama": hf_llama_items, "gpt2": hf_gpt2_items, "layernorm": hf_layernorm_items,
                   "gemma2": hf_gemma2_items}[layout]
        return itemize(shape, batch, seq_len, e, fused=fused, dropout=drops, mask_bytes=mask_b)
    s, b, h, a = seq_len, batch, shape.n_embd, shape.n_head
    f, v = shape.ffn, shape.vocab_size
    kv = shape.kv_heads * shape.head_dim
    e = DTYPE_BYTES[dtype] if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # matmul inputs
    r = FP32 if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # residual stream, norm inputs
    # Softmax output: autocast on CUDA runs softmax in fp32 and the next matmul keeps a 16-bit cast.
    sm = FP32 if (param_dtype == "fp32" and (dtype == "fp32" or device_kind != "cpu")) else e
    sm_cast = e if (step.autocast and device_kind != "cpu") else 0
    lp = FP32 if param_dtype == "fp32" else DTYPE_BYTES[param_dtype]  # log-softmax output
    stats = 2 if shape.norm == "layernorm" else 1  # mean and rstd (or rstd), fp32
    sbh = s * b * h
    # CUDA's fused dropout keeps a bool mask; the CPU path keeps a scaled mask in the input's dtype.
    cpu = device_kind == "cpu"

    def mask(dtype_bytes: int) -> tuple[str, int]:
        return ("dropout mask (scaled, input dtype)", dtype_bytes) if cpu else ("dropout mask (bool)", BOOL)

    items: list[MemoryItem] = []

    def add(block: str, what: str, formula: str, nbytes: int, per_layer: bool = True, category: str = "activations") -> None:
        items.append(MemoryItem(block, what, formula, int(nbytes), per_layer, category))

    # Once: embedding.
    add("embedding", "positions (int64)", "s*8", s * INT64, per_layer=False)
    if drops.embedding:
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
        if drops.attention:
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
    if drops.residual:
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
    if drops.residual:
        what, mb = mask(e)
        add("mlp.proj", what, f"sbh*{mb}", sbh * mb)
    if step.autocast:
        pp = param_parts(shape)
        add("autocast", "16-bit weight copies", "2*layer matmul weights", 2 * pp.matmul_weights_per_layer)
    # Once: head and loss.
    add("ln_f", "input (residual stream)", f"sbh*{r}", sbh * r, per_layer=False)
    add("ln_f", "mean/rstd (fp32)", f"{stats}*sb*4", stats * s * b * FP32, per_layer=False)
    add("lm_head", "input (ln_f output)", f"sbh*{e}", sbh * e, per_layer=False)
    if step.autocast:
        add("lm_head", "16-bit weight copy", "2*V*h", 2 * v * h, per_layer=False)
    add("loss", "log-softmax output", f"sbV*{lp}", s * b * v * lp, per_layer=False)
    add("loss", "loss (scalar)", "4", FP32, per_layer=False)
    return items
