"""What one device holds under a LoRA/QLoRA plan and tensor/pipeline parallelism: :class:`DeviceShare`.

Without a plan (``tp == pp == 1``, no adapters) the share is the whole model and every figure equals
the plain estimate's. Parameters are counted per pipeline stage (embedding first, final norm and
lm_head last) and per tensor-parallel rank (:mod:`lmprof.estimate.memory.parallel`); with LoRA only
the adapters train (:mod:`lmprof.estimate.memory.lora`). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

from lmprof.estimate.memory.lora import Linear, Lora, adapter_params, layer_linears, nf4_bytes, targeted
from lmprof.estimate.memory.parallel import Parallel, stage_layers, stage_start
from lmprof.estimate.memory.params import ParamCounts
from lmprof.estimate.memory.result import DTYPE_BYTES, MemoryItem
from lmprof.estimate.shape import ModelShape


@dataclass(frozen=True)
class DeviceShare:
    """One device's part of the model: its stage's layers, its tensor-parallel shard, what trains.

    ``params`` (elements) and ``param_bytes`` are everything it stores (QLoRA: NF4 linears);
    ``trainable`` counts the parameters with gradients and optimizer state (``trainable.total``,
    ``.tensors``, ``.largest``, ``.layer_params`` one layer's, ``head`` the lm_head and final norm's
    on a last stage). ``in_flight`` micro-batches keep activations (1F1B: ``pp - stage``).
    """

    stage: int
    first: bool
    last: bool
    layers: int
    in_flight: int
    tp: int
    sp: bool
    params: int
    param_bytes: int
    trainable: ParamCounts
    head: int
    linear_biases: int
    proj_grad: int  # elements of one MLP output projection's weight gradient (backward temporaries)
    vocab: int  # lm_head rows on this rank
    layer_bytes: int  # one layer's parameter bytes on this rank (what ZeRO-3/FSDP gathers)
    adapter_items: tuple[MemoryItem, ...] = ()
    persistent_grads: bool = False
    lora: Lora | None = None

    @property
    def trivial(self) -> bool:
        return self.tp == 1 and self.first and self.last and self.lora is None


def _dense(shape: ModelShape, layer: int) -> bool:
    # DeepSeek-style models put their dense layers first; that is the convention for every MoE model.
    return shape.moe and layer < shape.n_dense_layers


def replicated_layer_params(shape: ModelShape, dense: bool = False) -> int:
    """One layer's parameters every tensor-parallel rank keeps whole: norms, QK-norms/sinks/latent
    norms, row-parallel biases (o, down/proj), the router and the shared-expert gate."""
    d = shape.n_embd
    rep = shape.norms_per_layer * shape.norm_params() + shape.attn_extra_params() + (d if shape.has_o_bias else 0)
    if not shape.moe or dense:
        return rep + (d if shape.bias else 0)
    rep += d * shape.n_experts + (shape.n_experts if shape.router_bias else 0)
    rep += d if (shape.n_shared_experts and shape.shared_expert_gate) else 0
    return rep + ((shape.n_experts + shape.n_shared_experts) * d if shape.bias else 0)


def layer_params_on_rank(shape: ModelShape, tp: int, dense: bool = False) -> int:
    """One layer's parameters on one tensor-parallel rank: replicated + the rest / tp."""
    rep = replicated_layer_params(shape, dense)
    return rep + (shape.layer_params(dense=dense) - rep) // tp


def _tensor_on_rank(lin: Linear, tp: int) -> int:
    # The router and the shared-expert gate are replicated; every other layer linear is split.
    return lin.d_in * lin.d_out // (tp if lin.target else 1)


def device_share(shape: ModelShape, pp: ParamCounts, *, par: Parallel, lora: Lora | None, stage: int,
                 param_dtype: str, dtype: str, batch: int, seq_len: int) -> DeviceShare:
    """The share of pipeline stage ``stage`` on one tensor-parallel rank (see the module docstring)."""
    t, p_bytes = par.tp, DTYPE_BYTES[param_dtype]
    first, last = stage == 0, stage == par.pp - 1
    n = stage_layers(shape.n_layer, par.pp, stage)
    start = stage_start(shape.n_layer, par.pp, stage)
    dense_here = sum(1 for i in range(start, start + n) if _dense(shape, i))
    vocab = -(-shape.vocab_size // t)
    d = shape.n_embd
    layers = (n - dense_here) * layer_params_on_rank(shape, t) + dense_here * layer_params_on_rank(shape, t, True)
    embed = vocab * d + shape.positions * d if first else 0
    lm_head = vocab * d if (not shape.tied or not first) else 0  # tied across stages: the last keeps a copy
    head = shape.norm_params() + lm_head + (vocab if shape.head_bias else 0) if last else 0
    base = embed + layers + head
    tensors = n * pp.layer_tensors + ((2 if shape.pos == "learned" else 1) if first else 0)
    tensors += (pp.norm_tensors + (1 if lm_head else 0)) if last else 0
    has_vocab = first or last
    largest = max(vocab * d if has_vocab else 0, shape.positions * d if first else 0, -(-pp.layer_largest // t))
    biases = pp.linear_biases if (t == 1 and par.pp == 1) else -(-pp.linear_biases * n // (shape.n_layer * t))
    full = ParamCounts(total=base, tensors=tensors, largest=largest, matmul_weights=0,
                       matmul_weights_per_layer=pp.matmul_weights_per_layer // t, linear_biases=biases,
                       layer_params=layer_params_on_rank(shape, t), layer_tensors=pp.layer_tensors,
                       norm_tensors=pp.norm_tensors, layer_largest=-(-pp.layer_largest // t))
    if t == 1 and par.pp == 1:
        full = pp  # the plain estimate's own counts, unchanged
    if lora is None:
        g_head = (vocab * d + shape.norm_params()) if last else 0
        return DeviceShare(stage, first, last, n, par.pp - stage, t, par.sp, params=base, param_bytes=base * p_bytes,
                           trainable=full, head=g_head, linear_biases=biases, proj_grad=d * shape.ffn // t,
                           vocab=vocab, layer_bytes=layer_params_on_rank(shape, t) * p_bytes,
                           persistent_grads=par.pp > 1)
    # LoRA: adapters train, the base is frozen (NF4 linears with QLoRA).
    per_layer = {dense: targeted(lora, layer_linears(shape, dense)) for dense in (False, True)}
    adapters_layer = {k: sum(adapter_params(lora, lin, t) for lin in v) for k, v in per_layer.items()}
    adapters = (n - dense_here) * adapters_layer[False] + dense_here * adapters_layer[True]
    ad_tensors = (n - dense_here) * 2 * sum(lin.count for lin in per_layer[False]) + dense_here * 2 * sum(
        lin.count for lin in per_layer[True])
    ad_largest = max((lora.rank * max(lin.d_in // (1 if lin.column else t), lin.d_out // (t if lin.column else 1))
                      for lin in per_layer[False] + per_layer[True]), default=0)
    layer_dense = shape.moe and shape.n_dense_layers == shape.n_layer
    trainable = ParamCounts(total=adapters, tensors=ad_tensors, largest=ad_largest, matmul_weights=0,
                            matmul_weights_per_layer=0, linear_biases=0, layer_params=adapters_layer[layer_dense],
                            layer_tensors=0, norm_tensors=0, layer_largest=ad_largest)
    base_bytes = base * p_bytes
    one_layer = layer_params_on_rank(shape, t, layer_dense) * p_bytes
    if lora.qlora:
        quantized, nf4 = 0, 0
        for dense, count in ((False, n - dense_here), (True, dense_here)):
            q, b4 = _quantized(shape, lora, t, dense)
            quantized, nf4 = quantized + count * q, nf4 + count * b4
        base_bytes = nf4 + (base - quantized) * p_bytes
        q, b4 = _quantized(shape, lora, t, layer_dense)
        one_layer += b4 - q * p_bytes
    proj = [lin for lin in per_layer[False] if lin.target == "mlp" and not lin.column and not lin.name.startswith(
        "expert.")]
    e = DTYPE_BYTES[dtype] if param_dtype == "fp32" else p_bytes
    items = tuple(
        MemoryItem("lora", f"{lin.name}: A output (rank {lora.rank})", f"{_tokens(lin)}sb*{lora.rank}*{e}",
                   round(lin.count * lin.tokens * seq_len * batch * lora.rank * e), True)
        for lin in per_layer[layer_dense])
    return DeviceShare(stage, first, last, n, par.pp - stage, t, par.sp, params=base + adapters,
                       param_bytes=base_bytes + adapters * p_bytes, trainable=trainable, head=0,
                       linear_biases=biases, proj_grad=sum(adapter_params(lora, lin, t) for lin in proj),
                       vocab=vocab, layer_bytes=one_layer + adapters_layer[layer_dense] * p_bytes,
                       adapter_items=items, persistent_grads=par.pp > 1, lora=lora)


def _quantized(shape: ModelShape, lora: Lora, tp: int, dense: bool) -> tuple[int, int]:
    """(elements, NF4 bytes) of one layer's linear weights on one rank; each tensor quantized on its own."""
    elements, nbytes = 0, 0
    for lin in layer_linears(shape, dense):
        elems = _tensor_on_rank(lin, tp)
        elements += lin.count * elems
        nbytes += lin.count * nf4_bytes(elems, lora.double_quant)
    return elements, nbytes


def _tokens(lin: Linear) -> str:
    share = lin.count * lin.tokens
    return "" if share == 1 else f"{share:g}*"
