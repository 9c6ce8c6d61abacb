"""Tensor, sequence and pipeline parallelism: what one device holds (Megatron-LM's layout).

* **Tensor parallel** over ``tp`` ranks: attention (q/k/v column-split by heads, o row-split) and MLP
  (fc/gate/up column-split, proj/down row-split, each expert likewise) weights and their column
  biases are divided by ``tp``; the vocabulary-parallel embedding and lm_head hold ``ceil(V / tp)``
  rows each; norms, the router, row-parallel biases and learned positions are replicated.
* **Activations** follow Korthikanti et al. 2022 (arXiv:2205.05198), section 4.2, table 2: with
  tensor parallelism everything inside the attention and MLP regions is divided by ``tp`` while the
  layer-norm inputs, the column-parallel linears' inputs and the residual dropout masks (the paper's
  ``10sbh``) stay whole on every rank: ``sbh(10 + 24/t + 5as/(ht))`` per layer; **sequence
  parallelism** splits those along the sequence too: ``sbh/t (34 + 5as/h)``.
* **Pipeline parallel** over ``pp`` stages: stage ``i`` holds layers ``[i L/p, (i+1) L/p)`` (the first
  ``L mod p`` stages one more), the embedding on the first stage, the final norm and lm_head on the
  last (with tied embeddings the last stage keeps its own copy of the embedding shard, as Megatron
  does). Under the 1F1B schedule stage ``i`` holds the activations of ``p - i`` micro-batches, so
  the first stage holds ``p`` of them; gradients accumulate across micro-batches and live through
  the whole step.

No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from lmprof.errors import ConfigError
from lmprof.estimate.memory.result import MemoryItem
from lmprof.estimate.shape import ModelShape

MAX_DEGREE = 2**12


@dataclass(frozen=True)
class Parallel:
    """Model-parallel degrees: ``tp`` tensor-parallel ranks (``sp``: with sequence parallelism) and
    ``pp`` pipeline stages. Data parallelism (and ZeRO/FSDP over it) is the fit plan's ``gpus``."""

    tp: int = 1
    pp: int = 1
    sp: bool = False

    @property
    def trivial(self) -> bool:
        return self.tp == 1 and self.pp == 1

    def check(self, shape: ModelShape) -> None:
        """ConfigError (one line) for degrees that cannot split ``shape``."""
        for flag, value in (("--tp", self.tp), ("--pp", self.pp)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
                raise ConfigError(f"{flag} must be a whole number between 1 and {MAX_DEGREE:,}, got {value!r}")
        t = self.tp
        if self.sp and t == 1:
            raise ConfigError("--sp (sequence parallelism) splits the tensor-parallel group: it needs --tp 2 or more")
        if self.pp > shape.n_layer:
            raise ConfigError(f"--pp {self.pp} exceeds the model's {shape.n_layer} layers: every stage needs a layer")
        if t == 1:
            return
        if shape.mla:
            raise ConfigError("tensor parallelism of multi-head latent attention (DeepSeek-V2/V3) is not modelled")
        if shape.n_head % t or shape.kv_heads % t:
            raise ConfigError(f"--tp {t} must divide the attention heads ({shape.n_head}) and the key/value heads "
                              f"({shape.kv_heads})")
        widths = {"d_ff": shape.ffn}
        if shape.moe:
            widths["expert d_ff"] = shape.expert_ffn
            if shape.n_shared_experts:
                widths["shared expert d_ff"] = shape.shared_ffn
        for name, width in widths.items():
            if width % t:
                raise ConfigError(f"--tp {t} must divide the MLP width ({name} {width})")

    def describe(self, shape: ModelShape, training: bool = False) -> str:
        """One line: the degrees, and for pipelines the layers on the first and last stage."""
        parts = []
        if self.tp > 1:
            parts.append(f"tensor parallel {self.tp}" + (" + sequence parallel" if self.sp else ""))
        if self.pp > 1:
            schedule = "1F1B, batch = one micro-batch; " if training else ""
            first, last = stage_layers(shape.n_layer, self.pp, 0), stage_layers(shape.n_layer, self.pp, self.pp - 1)
            parts.append(f"pipeline parallel {self.pp} ({schedule}{counted(first, 'layer')} on the first stage, "
                         f"{last} on the last)")
        return ", ".join(parts)


def counted(count: int, noun: str) -> str:
    """``1 layer``, ``2 layers``, ``3 micro-batches``."""
    return f"{count} {noun}{'' if count == 1 else ('es' if noun.endswith('h') else 's')}"


def stage_layers(n_layer: int, pp: int, stage: int) -> int:
    """Layers on pipeline stage ``stage``: ``n_layer // pp``, the first ``n_layer % pp`` stages one more."""
    return n_layer // pp + (1 if stage < n_layer % pp else 0)


def stage_start(n_layer: int, pp: int, stage: int) -> int:
    """Index of the first layer on ``stage``."""
    return sum(stage_layers(n_layer, pp, i) for i in range(stage))


# How an activation splits over the tensor-parallel group (Korthikanti et al. 2022, table 2).
SHARDED = "sharded"  # inside attention/MLP: divided by t
REGION = "region"  # layer-norm inputs and outputs, column-parallel inputs, residual dropout: / t with SP only
REPLICATED = "replicated"  # token ids, positions, rotary tables, causal masks, the loss: whole everywhere


def item_split(item: MemoryItem) -> str:
    """Which of SHARDED, REGION, REPLICATED an itemized saved tensor is."""
    block, what = item.block, item.what
    if block.startswith("ln_"):
        return REGION  # norm inputs, statistics and outputs (the next column-parallel linear's input)
    if block in ("attn.qkv", "mlp.fc", "lm_head") and what.startswith("input"):
        return REGION
    if "dropout mask" in what and block in ("attn.proj", "mlp.proj", "embedding"):
        return REGION
    if (block in ("embedding", "loss") and "log-softmax" not in what) or "causal mask" in what:
        return REPLICATED
    return SHARDED


def split_items(items: list[MemoryItem], par: Parallel) -> list[MemoryItem]:
    """Each item as one tensor-parallel rank keeps it (bytes divided where the split says)."""
    if par.tp == 1:
        return items
    out = []
    for it in items:
        kind = item_split(it)
        if kind == SHARDED or (kind == REGION and par.sp):
            out.append(replace(it, bytes=-(-it.bytes // par.tp), formula=f"({it.formula})/{par.tp}"))
        else:
            out.append(it)
    return out
