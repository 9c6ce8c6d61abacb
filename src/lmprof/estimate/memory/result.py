"""The estimate's types and constants: one tensor kind (:class:`MemoryItem`) and one breakdown (:class:`MemoryEstimate`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from lmprof.estimate.shape import ModelShape
from lmprof.modes import Mode, traits

Attention = Literal["math", "sdpa"]
ATTENTIONS: tuple[Attention, ...] = ("math", "sdpa")
Optimizer = Literal["adamw", "sgd"]
# What an estimate's ``optimizer`` may say: the plan (estimate/fit.py) also names bitsandbytes' 8-bit AdamW.
EstimateOptimizer = Literal["adamw", "adamw8bit", "sgd"]
OptimizerImpl = Literal["auto", "foreach", "for-loop", "fused"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Categories of the breakdown, in the order they are shown; ``at_peak`` splits the peak into them.
AT_PEAK = ("params", "buffers", "grads", "optimizer", "activations", "logits", "kv_cache", "temporaries")
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

    shape: ModelShape | None  # None: the figures were read off the model (``source`` "model")
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
    # The attention kernel the estimate assumes: "fused" (sdpa's flash / memory-efficient kernels) or
    # "math" (scores and probabilities materialised: attention="math", or sdpa falling back to it).
    attention_path: str = "math"
    # Parameters with gradients and optimizer state on this device (every parameter without a plan;
    # the adapters with LoRA). 0 means n_params (estimates built before the field existed).
    trainable_params: int = 0
    # The LoRA / model-parallel plan one line each, and the elements one device stores (0: n_params).
    plan: tuple[str, ...] = ()
    device_params: int = 0
    # One layer's parameter bytes on this device and its gradient bytes (ZeRO-3/FSDP gather one layer).
    layer_bytes: int = 0
    layer_grad_bytes: int = 0
    # Layers on this device's pipeline stage (0: all) and the micro-batches whose activations it holds.
    stage_layers: int = 0
    in_flight: int = 1
    # Where the figures came from: "formula" (lmprof's formulas for the family), "model" (read off the
    # model on the meta device), "generic" (a Llama-like guess, asked for with --allow-generic).
    source: str = "formula"
    layers: int = 0  # the model's layers (0: the shape's)

    @property
    def n_layer(self) -> int:
        return self.layers or (self.shape.n_layer if self.shape is not None else 0)

    @property
    def trained(self) -> int:
        """Parameters that get gradients and optimizer state on this device."""
        return self.trainable_params or self.n_params

    @property
    def static(self) -> int:
        """Bytes that live for the whole run: parameters, buffers, optimizer state (and grads in train)."""
        return self.params + self.buffers + self.grads + self.optimizer_state

    def _kv_note(self) -> str:
        """How the KV cache figure is made up (the cache holds the compute dtype)."""
        sh, tail = self.shape, f"{self.kv_tokens} tokens x {self.batch} x {DTYPE_BYTES[self.dtype]} B"
        if sh is None:
            return f"the model's own cache after {self.kv_tokens} tokens x {self.batch} (read off the model)"
        if sh.mla:
            per = f"{sh.n_layer} layers x latent ({sh.kv_lora_rank} + rope {sh.qk_rope_head_dim})"
        else:
            heads = sh.n_head if sh.kv_cache_repeated else sh.kv_heads
            per = f"2 x {sh.n_layer} layers x {heads} kv heads x {sh.head_dim}" + (
                " (repeated to every head)" if sh.kv_cache_repeated else "")
        window = (f"; {sh.sliding_layers} windowed layers keep {sh.sliding_window - 1} tokens"
                  if sh.sliding_window and sh.sliding_layers and self.kv_tokens >= sh.sliding_window else "")
        return f"{per} x {tail}{window}"

    def breakdown(self) -> list[dict[str, Any]]:
        """Rows (category, bytes, at_peak, note): each category's size and its share of the peak.

        ``bytes`` is the category's full size; ``at_peak`` what of it is alive at the peak moment
        (gradients, say, are not yet allocated when the backward pass starts). ``at_peak`` adds up to
        the peak row.
        """
        a = self.at_peak
        rows: list[dict[str, Any]] = [
            {"category": "params", "bytes": self.params, "at_peak": a["params"],
             "note": self._params_note()},
            {"category": "buffers", "bytes": self.buffers, "at_peak": a["buffers"],
             "note": "causal mask, bool, per layer" if self.shape is not None else "the model's buffers (rotary tables, "
             "masks)"},
        ]
        if traits(self.mode).trains:
            rows += [
                {"category": "grads", "bytes": self.grads, "at_peak": a["grads"],
                 "note": f"same dtype as the params ({self.param_dtype})" + (
                     f", {self.trained:,} trainable" if self.trained != self.n_params else "")},
                {"category": "optimizer", "bytes": self.optimizer_state, "at_peak": a["optimizer"],
                 "note": self._optimizer_note()},
                {"category": "activations", "bytes": self.activations, "at_peak": a["activations"],
                 "note": f"saved for backward, {self.activations_per_layer:,} B per layer" if self.shape is not None
                 else "saved for backward (read off the model, each storage once)"},
                {"category": "logits", "bytes": self.logits, "at_peak": a["logits"],
                 "note": "b*s*V lm_head output, " + ("held by the caller until the step ends" if self.hold_logits
                                                     else "freed once the loss is computed")},
            ]
        else:
            rows += [
                {"category": "kv_cache", "bytes": self.kv_cache, "at_peak": a["kv_cache"],
                 "note": self._kv_note()},
                {"category": "logits", "bytes": self.logits, "at_peak": a["logits"], "note": "last position only"},
            ]
        rows.append({"category": "temporaries", "bytes": self.temporaries, "at_peak": a["temporaries"],
                     "note": f"extra at the peak moment ({self.peak_at})"})
        rows.append({"category": "peak", "bytes": self.peak, "at_peak": self.peak, "note": self.peak_at})
        return rows

    def _params_note(self) -> str:
        if not self.device_params or (self.device_params == self.n_params and not self.plan):
            return f"{self.n_params:,} x {_name_bytes(self.param_dtype)}"
        if any(line.startswith("QLoRA") for line in self.plan):
            return f"{self.device_params:,} on this device: layer linears NF4, the rest {_name_bytes(self.param_dtype)}"
        return f"{self.device_params:,} on this device, {_name_bytes(self.param_dtype)} each"

    def _optimizer_note(self) -> str:
        # moments in fp32 with fp32 parameters or a master copy, else in the parameters' dtype (torch's optimizers)
        state = "fp32" if self.master_weights or self.param_dtype == "fp32" else self.param_dtype
        parts = {"adamw": f"two {state} moments", "sgd": f"one {state} momentum buffer",
                 "adamw8bit": "two 1-byte moments + fp32 block scales"}[self.optimizer]
        if self.master_weights:
            parts += " + fp32 master weights"
        if self.optimizer.startswith("adamw"):
            parts += " + a step scalar per tensor"
        return parts

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = self.shape.to_dict() if self.shape is not None else None
        return out




def _name_bytes(dtype: str) -> str:
    return f"{DTYPE_BYTES[dtype]} B ({dtype})"
