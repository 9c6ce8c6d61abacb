"""Run configurations: typed, validated, loadable from YAML, overridable from CLI flags."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from lmprof.errors import ConfigError, DataError

Dtype = Literal["fp32", "bf16", "fp16"]
EnergyMode = Literal["auto", "off", "estimate"]

# Default sequence length per preset: short enough for a quick CPU run, the model's context for gpt2.
DEFAULT_SEQ_LEN = {"tiny": 64, "small": 256, "gpt2": 1024}


class ModelSpec(BaseModel):
    """Which built-in GPT: a preset plus optional overrides."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None
    vocab_size: int | None = None
    dropout: float | None = None
    bias: bool | None = None
    attention: Literal["math", "sdpa"] = "math"
    hf: str | None = None  # a Hugging Face model: local folder or cached hub id
    hf_config: str | None = None  # a Hugging Face architecture with random weights (offline)
    download: bool = False  # allow fetching --hf from the hub

    def label(self) -> str:
        """A short name for run folders: the HF model or the preset."""
        return (self.hf or self.hf_config or self.preset).replace("/", "_").strip("._") or "model"


class MeasureSpec(BaseModel):
    """How figures are taken: the same protocol for every mode."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = 3
    steps: int = 10
    profile_steps: int = 3
    device: str = "auto"
    dtype: Dtype = "fp32"
    compile: bool = False
    energy: EnergyMode = "auto"
    tdp_w: float | None = None  # rated power for --energy estimate
    idle_s: float = 1.0  # idle baseline before warm-up, when a real meter exists
    plots: bool = True  # per-run PNGs (roofline, memory timeline); sweeps turn them off
    seed: int = 0

    @field_validator("energy", mode="before")
    @classmethod
    def _energy(cls, v: object) -> object:
        # YAML 1.1 reads a bare `off` as false.
        return "off" if v is False else v

    @field_validator("warmup")
    @classmethod
    def _warmup(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"warm-up steps must be >= 0, got {v}")
        return v

    @field_validator("steps", "profile_steps")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive, got {v}")
        return v


class TrainConfig(ModelSpec, MeasureSpec):
    """Everything ``lmprof train`` needs."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = 8
    seq_len: int | None = None
    data: str | None = None
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 3e-4
    out: str = "runs"
    nproc: int = 1  # > 1: launch through torchrun, one trace per rank
    parallel: Literal["ddp", "fsdp"] = "ddp"  # how ranks share the model: replicas, or FSDP2 shards

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"batch size must be positive, got {v}")
        return v

    @field_validator("seq_len")
    @classmethod
    def _seq(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(f"sequence length must be positive, got {v}")
        return v


def build(model_cls: type[BaseModel], values: dict[str, Any]) -> Any:
    """Validate ``values`` into ``model_cls``, turning pydantic's report into one ConfigError line."""
    try:
        return model_cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "config"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        raise ConfigError(f"{where}: {msg}") from None


def load_yaml(path: str | Path | None) -> dict[str, Any]:
    """Read a YAML config file into a dict (empty when no path)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise DataError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


class InferConfig(ModelSpec, MeasureSpec):
    """Everything ``lmprof infer`` needs."""

    prompt: str | None = None
    prompt_len: int = 32
    batch_size: int = 1
    new_tokens: int = 50
    kv_cache: bool = True
    steps: int = 5
    warmup: int = 1
    profile_steps: int = 3  # several generations: per-block medians, and a spread to show
    out: str = "runs"

    @field_validator("new_tokens")
    @classmethod
    def _new(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"new tokens must be positive, got {v}")
        return v

    @field_validator("batch_size", "prompt_len")
    @classmethod
    def _pos(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive, got {v}")
        return v
