"""The shape of a decoder-only transformer: everything FLOP, byte and memory formulas need.

One description for every causal-LM family lmprof knows: the built-in GPT
(:func:`lmprof.workloads.gpt.GPTConfig.shape`), any Hugging Face causal-LM config
(:func:`lmprof.estimate.models.shape_from_config`) and the shipped table of well-known models
(``models.yaml``). Analytic counts never need the model itself. No torch import.

Defaults describe the built-in GPT (GPT-2 layout); the other fields say how a family differs:
grouped-query / multi-query attention (``n_kv_head``), a head size that is not ``n_embd / n_head``
(``d_head``, Gemma 2), gated MLPs (``mlp`` swiglu / geglu), biases on some linears only
(``qkv_bias``, ``norm_bias``), one, two or four norms per layer, parallel attention + MLP, sliding
windows (and chunked attention, counted as a window), QK-norm, attention sinks, multi-head latent
attention (DeepSeek: low-rank q / kv projections, a compressed KV cache) and mixture-of-experts MLPs
(routed experts, top-k, shared experts, a router bias, dense layers before or between MoE layers).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from lmprof.errors import ConfigError

# The range each size may take: wide enough for any published model (10M-token contexts, 256k
# vocabularies, thousands of experts) and narrow enough that every formula stays a small exact
# integer and no list of layers outgrows memory (a config with 10**30 layers is refused, not run).
LIMITS: dict[str, tuple[int, int]] = {
    "n_layer": (1, 4096), "n_head": (1, 4096), "n_kv_head": (1, 4096), "n_embd": (1, 2**20),
    "vocab_size": (1, 2**24), "block_size": (1, 2**27), "d_ff": (1, 2**22), "d_head": (1, 2**16),
    "n_experts": (0, 2**16), "top_k": (0, 2**16), "d_ff_expert": (1, 2**22), "n_shared_experts": (0, 2**10),
    "d_ff_shared": (1, 2**22), "sliding_window": (1, 2**27), "pos_offset": (0, 2**10),
    "n_dense_layers": (0, 4096), "q_lora_rank": (1, 2**20), "kv_lora_rank": (1, 2**20), "qk_rope_head_dim": (0, 2**16),
    "d_head_v": (1, 2**16),
}


def check_size(field: str, value: Any, where: str = "") -> int:
    """``value`` as a whole number in ``LIMITS[field]``; ConfigError naming ``where`` (or the field) and the range."""
    low, high = LIMITS[field]
    name = where or field
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number between {low:,} and {high:,}, got {str(value)[:40]!r}")
    if not low <= value <= high:
        got = f"{value:,}" if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise ConfigError(f"{name} must be between {low:,} and {high:,}, got {got}")
    return value


Mlp = Literal["gelu", "relu", "swiglu", "geglu"]
QkNorm = Literal["", "head", "full"]
MLP_KINDS: tuple[Mlp, ...] = ("gelu", "relu", "swiglu", "geglu")
GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer LM.

    ``mlp="gelu"``/``"relu"`` is the two-matrix MLP (d -> d_ff -> d); ``"swiglu"``/``"geglu"`` the
    three-matrix gated one (gate and up d -> d_ff, down d_ff -> d). ``n_kv_head`` < ``n_head`` means
    grouped-query attention (1: multi-query). ``bias`` is the linears' bias; ``qkv_bias`` and
    ``norm_bias`` override it for the q/k/v projections and the norms (None: follow ``bias``).
    ``n_experts`` > 0 makes every layer's MLP a mixture of experts: a router (d -> n_experts, no
    bias), ``top_k`` experts of width ``d_ff_expert`` per token, and ``n_shared_experts`` always-on
    experts of width ``d_ff_shared`` (with a sigmoid gate d -> 1 when ``shared_expert_gate``);
    ``n_dense_layers`` of the layers keep a dense MLP of width ``d_ff`` instead (DeepSeek's first
    layers, Llama 4's interleaving: where they sit changes no count).

    ``qk_norm`` normalises queries and keys: per head (``head``: one head_dim-wide norm each for q
    and k, Qwen3 / Gemma 3) or over their whole width (``full``: q_dim and kv_dim, OLMo 2).
    ``attn_sinks``: one learned logit per head per layer (gpt-oss). ``kv_lora_rank`` set means
    multi-head latent attention (DeepSeek-V3): q through a rank-``q_lora_rank`` bottleneck (or one
    d -> q projection), keys and values from a per-token latent of ``kv_lora_rank`` +
    ``qk_rope_head_dim`` elements, which is all the KV cache holds; ``d_head`` is then the
    query/key head size (nope + rope) and ``d_head_v`` the value head size.
    """

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    n_kv_head: int | None = None
    d_ff: int | None = None
    mlp: Mlp = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    pos: Literal["learned", "rope"] = "learned"
    bias: bool = True
    tied: bool = True
    name: str = ""
    d_head: int | None = None
    qkv_bias: bool | None = None
    norm_bias: bool | None = None
    norms_per_layer: int = 2
    parallel: bool = False
    pos_offset: int = 0  # extra learned position rows (OPT keeps 2)
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers attend within the window (all, or every other one)
    n_experts: int = 0
    top_k: int = 0
    d_ff_expert: int | None = None
    n_shared_experts: int = 0
    d_ff_shared: int | None = None
    shared_expert_gate: bool = False
    family: str = ""  # Hugging Face model_type, or "gpt" for the built-in model
    n_dense_layers: int = 0  # MoE models: layers whose MLP is dense (width d_ff)
    router_bias: bool = False
    o_bias: bool | None = None  # attention output projection's bias; None: follow ``bias``
    head_bias: bool = False  # a bias on the lm_head (Phi)
    qk_norm: QkNorm = ""
    attn_sinks: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    d_head_v: int | None = None
    kv_cache_repeated: bool = False  # the cache holds K and V repeated to every query head (Falcon's new layout)

    def __post_init__(self) -> None:
        for field in LIMITS:
            value = getattr(self, field)
            if value is not None:
                check_size(field, value)
        if self.d_head is None and self.n_embd % self.n_head:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.kv_heads})")
        if self.mlp not in MLP_KINDS:
            raise ConfigError(f"mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.norms_per_layer not in (1, 2, 4):
            raise ConfigError(f"norms_per_layer must be 1, 2 or 4, got {self.norms_per_layer}")
        if self.norms_per_layer == 1 and not self.parallel:
            raise ConfigError("one norm per layer needs parallel attention + MLP")
        if self.n_experts < 0 or self.n_shared_experts < 0:
            raise ConfigError("expert counts must be >= 0")
        if self.n_experts and not 0 < self.top_k <= self.n_experts:
            raise ConfigError(f"top_k must be in 1..n_experts ({self.n_experts}), got {self.top_k}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"sliding_window must be positive, got {self.sliding_window}")
        if not 0 <= self.sliding_layers <= self.n_layer:
            raise ConfigError(f"sliding_layers must be in 0..n_layer, got {self.sliding_layers}")
        if self.n_dense_layers and not (self.moe and self.n_dense_layers <= self.n_layer):
            raise ConfigError(f"n_dense_layers ({self.n_dense_layers}) needs experts and at most n_layer layers")
        if self.qk_norm not in ("", "head", "full"):
            raise ConfigError(f"qk_norm must be '', 'head' or 'full', got {self.qk_norm!r}")
        if self.mla and self.qk_rope_head_dim >= self.head_dim:
            raise ConfigError("qk_rope_head_dim must be below the query/key head size (d_head)")

    # -- derived sizes ---------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.d_head or self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output before o_proj): n_head x head_dim."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token: n_kv_head x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (a compressed KV cache)."""
        return self.kv_lora_rank is not None

    @property
    def v_head_dim(self) -> int:
        return self.d_head_v or self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the attention output before the output projection: n_head x value head size."""
        return self.n_head * self.v_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layer - self.n_dense_layers if self.moe else 0

    @property
    def has_o_bias(self) -> bool:
        return self.bias if self.o_bias is None else self.o_bias

    @property
    def ffn(self) -> int:
        return self.d_ff or 4 * self.n_embd

    @property
    def gated(self) -> bool:
        return self.mlp in GATED

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    @property
    def expert_ffn(self) -> int:
        return self.d_ff_expert or self.ffn

    @property
    def shared_ffn(self) -> int:
        return self.d_ff_shared or self.expert_ffn

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_norm_bias(self) -> bool:
        return (self.bias if self.norm_bias is None else self.norm_bias) and self.norm == "layernorm"

    @property
    def positions(self) -> int:
        """Rows of the learned position table (0 with rotary positions)."""
        return self.block_size + self.pos_offset if self.pos == "learned" else 0

    def norm_params(self) -> int:
        """Parameters of one norm: gamma (+ beta for a LayerNorm with bias)."""
        return self.n_embd * (2 if self.has_norm_bias else 1)

    # -- parameter counts --------------------------------------------------------------------------

    def qkv_weights(self) -> int:
        """Matmul weights of one layer's q, k and v projections (MLA: the low-rank ones)."""
        d = self.n_embd
        if not self.mla:
            return d * self.q_dim + 2 * d * self.kv_dim
        r_kv = self.kv_lora_rank or 0
        q = d * self.q_lora_rank + self.q_lora_rank * self.q_dim if self.q_lora_rank else d * self.q_dim
        nope = self.head_dim - self.qk_rope_head_dim
        return q + d * (r_kv + self.qk_rope_head_dim) + r_kv * self.n_head * (nope + self.v_head_dim)

    def qkv_out(self) -> int:
        """Elements per token the q/k/v projections write (MLA: q, the latent and the expanded k/v)."""
        if not self.mla:
            return self.q_dim + 2 * self.kv_dim
        nope = self.head_dim - self.qk_rope_head_dim
        r_kv = self.kv_lora_rank or 0
        return (self.q_lora_rank or 0) + self.q_dim + r_kv + self.qk_rope_head_dim + self.n_head * (nope + self.v_head_dim)

    def attn_weights(self) -> int:
        """Matmul weights of one layer's attention: q, k, v and output projections."""
        return self.qkv_weights() + self.v_dim * self.n_embd

    def attn_biases(self) -> int:
        qkv = (self.q_dim + 2 * self.kv_dim) if self.has_qkv_bias and not self.mla else 0
        return qkv + (self.n_embd if self.has_o_bias else 0)

    def attn_extra_params(self) -> int:
        """One layer's attention parameters outside the projections: QK-norms, sinks, MLA's latent norms."""
        per_norm = 2 if self.has_norm_bias else 1
        qk = {"": 0, "head": 2 * self.head_dim, "full": self.q_dim + self.kv_dim}[self.qk_norm] * per_norm
        sinks = self.n_head if self.attn_sinks else 0
        latent = (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)
        return qk + sinks + latent

    def _mlp_weights(self, f: int) -> int:
        return (3 if self.gated else 2) * self.n_embd * f

    def _mlp_biases(self, f: int) -> int:
        if not self.bias:
            return 0
        return (2 * f if self.gated else f) + self.n_embd

    def expert_params(self) -> int:
        """Parameters of one routed expert (or of the dense MLP when not MoE)."""
        f = self.expert_ffn if self.moe else self.ffn
        return self._mlp_weights(f) + self._mlp_biases(f)

    def mlp_weights(self, active: bool = False, dense: bool = False) -> int:
        """Matmul weights of one layer's MLP; with ``active``, only those one token uses.

        An MoE model's layer is an MoE layer unless ``dense`` (one of its ``n_dense_layers``).
        """
        if not self.moe or dense:
            return self._mlp_weights(self.ffn)
        experts = self.top_k if active else self.n_experts
        router = self.n_embd * self.n_experts
        shared = self.n_shared_experts * self._mlp_weights(self.shared_ffn)
        gate = self.n_embd if (self.n_shared_experts and self.shared_expert_gate) else 0
        return router + experts * self._mlp_weights(self.expert_ffn) + shared + gate

    def mlp_params(self, active: bool = False, dense: bool = False) -> int:
        if not self.moe or dense:
            return self._mlp_weights(self.ffn) + self._mlp_biases(self.ffn)
        experts = self.top_k if active else self.n_experts
        shared = self.n_shared_experts * self._mlp_biases(self.shared_ffn)
        router = self.n_experts if self.router_bias else 0
        return self.mlp_weights(active) + experts * self._mlp_biases(self.expert_ffn) + shared + router

    def layer_params(self, active: bool = False, dense: bool = False) -> int:
        """One layer's parameters (an MoE model's MoE layer unless ``dense``)."""
        return (self.norms_per_layer * self.norm_params() + self.attn_weights() + self.attn_biases()
                + self.attn_extra_params() + self.mlp_params(active, dense))

    def layers_params(self, active: bool = False) -> int:
        """All layers' parameters: dense and MoE layers each counted as what they are."""
        dense = self.n_dense_layers if self.moe else 0
        return (self.n_layer - dense) * self.layer_params(active) + dense * self.layer_params(active, dense=True)

    def n_params(self, active: bool = False) -> int:
        """Exact parameter count (tied lm_head counted once); ``active``: those one token uses (MoE)."""
        d, v = self.n_embd, self.vocab_size
        embed = v * d + self.positions * d
        head = (0 if self.tied else v * d) + (v if self.head_bias else 0)
        return embed + self.layers_params(active) + self.norm_params() + head

    def n_params_non_embedding(self, active: bool = False) -> int:
        """Parameters minus the position embeddings: nanoGPT's N for the 6N FLOPs rule.

        The token embedding stays in when tied, because it is also the lm_head's matmul weight.
        """
        tok = 0 if self.tied else self.vocab_size * self.n_embd
        return self.n_params(active) - self.positions * self.n_embd - tok

    def matmul_weights(self, active: bool = False) -> int:
        """Weights used in matmuls per token: every layer's linears plus the lm_head (V x d).

        2 x this is the forward's weight FLOPs per token; the embedding lookup is not a matmul.
        """
        dense = self.n_dense_layers if self.moe else 0
        mlp = (self.n_layer - dense) * self.mlp_weights(active) + dense * self.mlp_weights(active, dense=True)
        return self.n_layer * self.attn_weights() + mlp + self.vocab_size * self.n_embd

    def attended(self, layer: int, keys: int) -> int:
        """Keys the ``layer``-th layer attends to out of ``keys``: capped by its sliding window."""
        if self.sliding_window is not None and layer < self.sliding_layers:
            return min(keys, self.sliding_window)
        return keys

    @property
    def kv_width(self) -> int:
        """Elements one layer caches per token: K and V (2 x kv_dim; 2 x q_dim where the model caches them
        repeated to every head), or MLA's latent (kv_lora_rank + rope)."""
        if self.mla:
            return (self.kv_lora_rank or 0) + self.qk_rope_head_dim
        return 2 * (self.q_dim if self.kv_cache_repeated else self.kv_dim)

    def kv_elements_per_token(self, context: int | None = None) -> int:
        """K and V elements cached per token over all layers (layers x :attr:`kv_width`).

        With ``context`` and a sliding window, layers that keep only the window count pro rata.
        """
        if context is None or not self.sliding_layers:
            return self.n_layer * self.kv_width
        total = sum(self.attended(i, context) for i in range(self.n_layer))
        return round(self.kv_width * total / context)

    def kv_cache_elements(self, tokens: int) -> int:
        """Elements of the KV cache of one sequence after ``tokens`` tokens, as Hugging Face keeps it.

        A sliding-window (or chunked) layer keeps its last ``window - 1`` tokens: the next token's own
        key and value complete the window it attends to.
        """
        kept = sum(min(tokens, self.sliding_window - 1) if self.sliding_window is not None and i < self.sliding_layers
                   else tokens for i in range(self.n_layer))
        return kept * self.kv_width

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
