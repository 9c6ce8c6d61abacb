"""One record per family lmprof's formulas know, read from the ``families:`` section of ``models.yaml``.

Every table that names families is derived from these records: which config reader builds the
shape and with which defaults (:mod:`.models`), where a family drops activations
(:mod:`.dropout`), which saved-tensor itemization its training memory uses
(:mod:`.memory.hf_activations`), which projections its modules fuse (:mod:`.memory.lora`) and
which block-name rules its modules get in measured runs (``lmprof.workloads.hooks``). Adding a
family the describer already reads is a record here and, for its formulas, a layout the readers
know. No torch import: this is data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# Values each field may take (a record with another one is a mistake in models.yaml).
READERS = ("llama-like", "gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode", "phi", "deepseek")
LAYOUTS = ("", "llama", "gpt2", "layernorm", "gemma2")
EXPERTS = ("", "mixtral", "qwen", "gpt_oss", "llama4", "routed")
DENSE = ("", "qwen", "llama4", "first_k")
QK_NORMS = ("", "head", "full", "use_qk_norm")


@dataclass(frozen=True)
class Family:
    """What lmprof knows of one Hugging Face ``model_type`` (see models.yaml for each field's meaning)."""

    name: str
    example: str | None = None
    reads: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    reader: str = "llama-like"
    layout: str = ""
    blocks: str = ""
    dropout: dict[str, str] = field(default_factory=dict)  # site -> config key
    dropout_defaults: dict[str, float] = field(default_factory=dict)  # config key -> transformers' default
    fused: tuple[str, ...] = ()
    tied: bool = False
    attention_bias: bool = False
    o_bias: bool = False
    qkv_bias: bool = False
    norms: int = 2
    qk_norm: str = ""
    sliding: str = "all"
    experts: str = ""
    dense: str = ""

    def __post_init__(self) -> None:
        for what, value, allowed in (("reader", self.reader, READERS), ("layout", self.layout, LAYOUTS),
                                     ("experts", self.experts, EXPERTS), ("dense", self.dense, DENSE),
                                     ("qk_norm", self.qk_norm, QK_NORMS), ("sliding", self.sliding, ("all", "half"))):
            if value not in allowed:
                raise ValueError(f"models.yaml: family {self.name}: {what} {value!r} is not one of {allowed}")


def _record(name: str, raw: dict[str, Any], common: list[str]) -> Family:
    sites: dict[str, str] = {}
    defaults: dict[str, float] = {}
    for site, spec in (raw.get("dropout") or {}).items():
        key, _, default = str(spec).partition("=")
        sites[site] = key
        if default:
            defaults[key] = float(default)
    reads = tuple(k for r in raw.get("reads", []) for k in (common if r == "llama-like" else [r]))
    plain = {k: v for k, v in raw.items() if k not in ("dropout", "reads", "ignored", "fused")}
    return Family(name=name, reads=reads, ignored=tuple(raw.get("ignored", [])), fused=tuple(raw.get("fused", [])),
                  dropout=sites, dropout_defaults=defaults, **plain)


@lru_cache(maxsize=1)
def families() -> dict[str, Family]:
    """Every family's record, by ``model_type``, in file order."""
    path = Path(str(resources.files("lmprof.estimate").joinpath("models.yaml")))
    raw = dict(yaml.safe_load(path.read_text())["families"])
    common = list(raw.pop("llama-like")["reads"])
    return {name: _record(name, dict(spec), common) for name, spec in raw.items()}


def family(model_type: str) -> Family | None:
    """The record of ``model_type``; None for a family the formulas do not know."""
    return families().get(model_type)


def with_(attr: str, value: Any = True) -> tuple[str, ...]:
    """The families whose record has ``attr`` equal to ``value`` (``fused`` / ``dropout``: containing it)."""
    out = []
    for name, rec in families().items():
        got = getattr(rec, attr)
        if got == value or (isinstance(got, (tuple, dict)) and value in got):
            out.append(name)
    return tuple(out)
