"""LoRA / QLoRA plans: which linears get adapters, how many adapter parameters, NF4 weight bytes.

A LoRA adapter on a ``d_in x d_out`` linear is two matrices, A (``r x d_in``) and B (``d_out x r``):
``r * (d_in + d_out)`` parameters, the only ones that train. The base weights stay frozen, in the
run's parameter dtype or, for QLoRA, as 4-bit NF4 (bitsandbytes ``Linear4bit``): half a byte per
weight plus the blockwise absmax constants (:func:`nf4_bytes`). ``alpha`` only scales B's output and
costs no memory, so the plan has no field for it.

The linears are listed per layer as the family's modules have them (:func:`layer_linears`): a fused
q/k/v projection (GPT-2's ``c_attn``, GPT-NeoX's ``query_key_value``, Phi-3's ``qkv_proj``) is one
linear of width ``q_dim + 2 kv_dim``, otherwise q, k, v are three, k and v ``kv_heads x head_dim``
wide (grouped-query attention). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmprof.errors import ConfigError
from lmprof.estimate.families import with_
from lmprof.estimate.shape import ModelShape

LoraTargets = Literal["attn", "all-linear"]
LORA_TARGETS: tuple[LoraTargets, ...] = ("attn", "all-linear")
MAX_RANK = 2**16
NF4_BLOCK = 64  # weights per absmax constant (bitsandbytes' default blocksize for 4-bit)
NESTED_BLOCK = 256  # absmax constants per fp32 second-level constant (double quantization)
# Families whose modules fuse q, k and v into one linear (the built-in GPT, and the records that say so:
# GPT-2, GPT-BigCode, GPT-NeoX, Falcon, Phi-3), and gate and up (Phi-3).
FUSED_QKV = ("", "gpt", *with_("fused", "qkv"))
FUSED_GATE_UP = with_("fused", "gate_up")


@dataclass(frozen=True)
class Lora:
    """A LoRA (``qlora=False``) or QLoRA plan: adapters of rank ``rank`` on ``targets``.

    ``targets``: ``attn`` (the attention projections q, k, v, o: the original LoRA recipe) or
    ``all-linear`` (those plus every MLP linear, routed and shared experts included; not the
    router, the lm_head or the embeddings, as peft's ``all-linear`` leaves the output layer out).
    ``qlora``: the frozen layer linears are NF4; ``double_quant`` (QLoRA's default) quantizes their
    absmax constants to 8 bits.
    """

    rank: int
    targets: LoraTargets = "attn"
    qlora: bool = False
    double_quant: bool = True

    def check(self, shape: ModelShape) -> None:
        """ConfigError (one line) for a plan that cannot apply to ``shape``."""
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= MAX_RANK:
            raise ConfigError(f"--lora-rank must be a whole number between 1 and {MAX_RANK:,}, got {self.rank!r}")
        if self.targets not in LORA_TARGETS:
            raise ConfigError(f"--lora-targets must be one of {', '.join(LORA_TARGETS)}, got {self.targets!r}")
        if shape.mla:
            raise ConfigError("LoRA on multi-head latent attention (DeepSeek-V2/V3) is not modelled")

    def describe(self) -> str:
        what = "q, k, v, o" if self.targets == "attn" else "all layer linears (attention and MLP)"
        base = ("frozen base linears NF4 " + ("with double-quantized constants" if self.double_quant
                                              else "with fp32 constants")) if self.qlora else "frozen base weights"
        return (f"{'QLoRA' if self.qlora else 'LoRA'} rank {self.rank} on {what}; {base}; gradients and optimizer "
                "state for the adapters only")


@dataclass(frozen=True)
class Linear:
    """One kind of linear in a layer: ``count`` weights of ``d_in x d_out``.

    ``column``: Megatron splits its output (column-parallel: q/k/v, gate/up, fc) rather than its
    input (row-parallel: o, down/proj). ``tokens``: how many of a sequence's tokens it sees per
    token (an expert sees ``top_k / n_experts`` of them on average). ``target``: the plan's
    target group (``attn``, ``mlp`` or ``""`` for linears no plan targets, the router).
    """

    name: str
    d_in: int
    d_out: int
    count: int
    column: bool
    target: str
    tokens: float = 1.0


def layer_linears(shape: ModelShape, dense: bool = False) -> list[Linear]:
    """Every matmul weight of one layer (an MoE model's MoE layer unless ``dense``), as the modules hold them."""
    d = shape.n_embd
    out: list[Linear] = []
    if shape.family in FUSED_QKV:
        out.append(Linear("qkv", d, shape.q_dim + 2 * shape.kv_dim, 1, True, "attn"))
    else:
        out += [Linear("q", d, shape.q_dim, 1, True, "attn"), Linear("k", d, shape.kv_dim, 1, True, "attn"),
                Linear("v", d, shape.kv_dim, 1, True, "attn")]
    out.append(Linear("o", shape.v_dim, d, 1, False, "attn"))

    def mlp(prefix: str, f: int, count: int, tokens: float) -> None:
        if not shape.gated:
            out.extend([Linear(f"{prefix}fc", d, f, count, True, "mlp", tokens),
                        Linear(f"{prefix}proj", f, d, count, False, "mlp", tokens)])
        elif shape.family in FUSED_GATE_UP:
            out.extend([Linear(f"{prefix}gate_up", d, 2 * f, count, True, "mlp", tokens),
                        Linear(f"{prefix}down", f, d, count, False, "mlp", tokens)])
        else:
            out.extend([Linear(f"{prefix}gate", d, f, count, True, "mlp", tokens),
                        Linear(f"{prefix}up", d, f, count, True, "mlp", tokens),
                        Linear(f"{prefix}down", f, d, count, False, "mlp", tokens)])

    if not shape.moe or dense:
        mlp("", shape.ffn, 1, 1.0)
        return out
    out.append(Linear("router", d, shape.n_experts, 1, True, ""))
    mlp("expert.", shape.expert_ffn, shape.n_experts, shape.top_k / shape.n_experts)
    if shape.n_shared_experts:
        mlp("shared.", shape.shared_ffn, shape.n_shared_experts, 1.0)
        if shape.shared_expert_gate:
            out.append(Linear("shared.gate", d, 1, 1, True, ""))
    return out


def targeted(lora: Lora, linears: list[Linear]) -> list[Linear]:
    """The linears of ``linears`` that carry an adapter under ``lora``."""
    groups = ("attn",) if lora.targets == "attn" else ("attn", "mlp")
    return [lin for lin in linears if lin.target in groups]


def adapter_params(lora: Lora, lin: Linear, tp: int = 1) -> int:
    """Adapter parameters of the ``count`` linears ``lin`` on one tensor-parallel rank.

    Column-parallel: A (``r x d_in``) whole on every rank, B's ``d_out`` split; row-parallel: A's
    ``d_in`` split, B (``d_out x r``) whole. Without tensor parallelism ``r * (d_in + d_out)``.
    """
    r = lora.rank
    if lin.column:
        return lin.count * r * (lin.d_in + lin.d_out // tp)
    return lin.count * r * (lin.d_in // tp + lin.d_out)


def nf4_bytes(elements: int, double_quant: bool) -> int:
    """Bytes of one NF4-quantized weight tensor of ``elements`` values (bitsandbytes' layout).

    Two 4-bit codes per byte, and one absmax per block of 64 values: fp32 (0.5 bit per weight), or
    with double quantization an 8-bit code per block plus one fp32 constant per 256 blocks
    (8/64 + 32/16384 = 0.127 bit per weight). The 256-entry code tables and offsets are a few
    hundred bytes per tensor and left out.
    """
    blocks = -(-elements // NF4_BLOCK)
    packed = -(-elements // 2)
    if not double_quant:
        return packed + 4 * blocks
    return packed + blocks + 4 * -(-blocks // NESTED_BLOCK)
