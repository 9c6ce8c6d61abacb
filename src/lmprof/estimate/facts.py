"""What the model describer read off a model, as torch-free records the estimate side can take.

The describer (:mod:`lmprof.measure.model_facts`) builds a model on the meta device and reads from
it what the formulas of this package compute from a :class:`~lmprof.estimate.shape.ModelShape`:
parameters, FLOPs and bytes per block and phase, the tensors kept for backward and what the model's
own cache holds. Its answers arrive here as :class:`ModelFacts` so that ``estimate`` (roofline
costs, the memory estimate, the fit check) never imports torch.

Every figure lmprof gives names where it came from (:data:`Source`): ``formula`` (a family the
formulas know), ``model`` (read off the model by the describer) or ``generic`` (a Llama-like guess
from a config's generic keys, only when asked for).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from lmprof.names import PASS_PHASES

Source = Literal["formula", "model", "generic"]
SOURCES: tuple[Source, ...] = ("formula", "model", "generic")
SOURCE_NOTES: dict[str, str] = {
    "formula": "lmprof's formulas for this family",
    "model": "read off the model built on the meta device (lmprof's describer)",
    "generic": "a generic Llama-like guess from the config's generic keys (--allow-generic)",
}

# What a cache layer holds, as the describer names it.
CACHE_KINDS: tuple[str, ...] = ("attention KV", "latent KV", "conv state", "SSM state", "linear-attention state")


@dataclass(frozen=True)
class BlockRow:
    """One block in one phase of one pass, summed over its layers: FLOPs and bytes moved.

    ``phase``: forward / backward (a training step), prefill, decode (one step). ``weight_bytes``:
    parameters the block's ops read (each once per pass); ``act_bytes``: every other tensor its ops
    read or write, one op = one kernel (eager execution); ``kv_bytes``: what it read of the cache.
    ``count``: how many modules (layers) the row sums.
    """

    name: str
    phase: str
    flops: float
    weight_bytes: float = 0.0
    act_bytes: float = 0.0
    kv_bytes: float = 0.0
    count: int = 1

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes + self.kv_bytes


@dataclass(frozen=True)
class CacheLayer:
    """One layer's share of the model's own cache for one sequence.

    ``elements`` is what it held after ``tokens`` tokens; it grows by ``per_token`` elements with each
    further token (attention KV) until ``window`` tokens are kept (a sliding window), or stays fixed
    (``per_token`` 0: a convolution or recurrent state, or a full window).
    """

    layer: int
    kind: str
    elements: int
    tokens: int
    per_token: int = 0
    window: int | None = None

    def elements_at(self, tokens: int) -> int:
        """Elements held after ``tokens`` tokens of one sequence."""
        if not self.per_token:
            return self.elements
        kept = tokens if self.window is None else min(tokens, self.window)
        return self.per_token * kept


@dataclass(frozen=True)
class TrainMemory:
    """One training step's memory above the parameters, read off the model at two batch sizes.

    ``saved``: bytes autograd keeps for backward (saved-tensor hooks, each storage once, parameters
    left out) at ``batch`` and ``batch + 1``; ``live_peak``: the highest level of every tensor the step
    holds besides the parameters (activations, temporaries, gradients made so far) over forward and
    backward, and ``grads_at_peak`` the gradients in it; ``logits``: the lm_head output.
    """

    batch: int
    seq_len: int
    saved: int
    saved_next: int
    live_peak: int
    live_peak_next: int
    grads_at_peak: int
    peak_at: str  # "forward" or "backward"
    logits: int
    saved_by_block: tuple[tuple[str, int], ...] = ()

    def at(self, batch: int, what: str = "saved") -> int:
        """``saved`` or ``live_peak`` at another batch size (both are affine in the batch)."""
        a, b = (self.saved, self.saved_next) if what == "saved" else (self.live_peak, self.live_peak_next)
        return max(0, a + (batch - self.batch) * (b - a))


@dataclass(frozen=True)
class ModelFacts:
    """Everything the describer read off one model for one request (batch, tokens, dtype).

    Parameters: ``params`` (every element once), ``params_active`` (routed experts scaled to the
    ``top_k`` of ``n_experts`` a token uses, shared experts whole), ``param_tensors`` and
    ``largest_tensor`` (what optimizer extras scale with), ``matmul_weights`` (elements of the weights
    matmuls read: linears, expert tensors, the lm_head), ``param_bytes`` at the dtype built.
    """

    family: str
    name: str
    dtype: str  # the dtype the model was built and run in
    params: int
    params_active: int
    param_tensors: int
    largest_tensor: int
    buffer_bytes: int
    n_layer: int
    hidden: int
    vocab: int
    max_positions: int
    layer_kinds: tuple[str, ...]  # the mixers of each layer ("attention", "SSM", "attention+SSM", ...)
    n_experts: int = 0
    top_k: int = 0
    matmul_weights: int = 0  # read off a prefill (0 when none was counted)
    param_bytes: int = 0  # the parameters' bytes as built (some modules stay fp32 in a 16-bit model)
    layer_param_bytes: int = 0  # the largest layer's parameter bytes (ZeRO-3 / FSDP gather one at a time)
    batch: int = 1
    seq_len: int = 1
    context: int = 1  # keys a decode step attends to (the cache after appending its token)
    rows: tuple[BlockRow, ...] = ()
    cache: tuple[CacheLayer, ...] = ()  # after a prefill of ``seq_len`` tokens, one sequence
    cache_bytes_per_element: int = 4
    prefill_live_peak: int | None = None  # bytes besides the parameters at the prefill's peak (cache included)
    prefill_live_peak_next: int | None = None  # the same at ``batch + 1`` (affine in the batch)
    train: TrainMemory | None = None
    notes: tuple[str, ...] = ()
    source: Source = "model"
    extra: dict[str, Any] = field(default_factory=dict)

    # -- FLOPs ------------------------------------------------------------------------------------

    def phase_rows(self, phase: str) -> list[BlockRow]:
        """The rows of one phase (forward, backward, prefill, decode), in data-flow order."""
        return [r for r in self.rows if r.phase == phase]

    def flops(self, phase: str) -> float:
        """FLOPs of one pass: ``train`` is forward + backward."""
        return float(sum(r.flops for r in self.rows if r.phase in PASS_PHASES.get(phase, (phase,))))

    def prefill_peak_at(self, batch: int) -> int | None:
        """The prefill's live peak at another batch size (affine in the batch), None when not read."""
        a, b = self.prefill_live_peak, self.prefill_live_peak_next
        if a is None:
            return None
        return max(0, a + (batch - self.batch) * ((b if b is not None else a * (self.batch + 1) // self.batch) - a))

    # -- cache --------------------------------------------------------------------------------------

    def cache_elements(self, tokens: int) -> int:
        """Elements the model's own cache holds for one sequence after ``tokens`` tokens."""
        return sum(layer.elements_at(tokens) for layer in self.cache)

    def cache_bytes(self, batch: int, tokens: int, bytes_per_element: int | None = None) -> int:
        """Bytes of the cache for ``batch`` sequences of ``tokens`` tokens."""
        width = self.cache_bytes_per_element if bytes_per_element is None else bytes_per_element
        return self.cache_elements(tokens) * batch * width

    def cache_by_kind(self, tokens: int) -> dict[str, int]:
        """Elements per sequence by what the cache holds (attention KV, SSM state, ...)."""
        out: dict[str, int] = {}
        for layer in self.cache:
            out[layer.kind] = out.get(layer.kind, 0) + layer.elements_at(tokens)
        return out

    def with_source(self, source: Source) -> ModelFacts:
        return replace(self, source=source)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
