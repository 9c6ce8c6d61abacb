"""Run configurations: typed, validated, loadable from YAML, overridable from CLI flags."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypedDict, TypeVar

import math
import os
import re

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo,
                      field_validator)

from lmprof.counts import DEFAULT_COUNTS, count_error
from lmprof.errors import ConfigError, DataError, DeviceError
from lmprof.safeyaml import load_file

Dtype = Literal["fp32", "bf16", "fp16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]

# Default sequence length per preset: short enough for a quick CPU run, the model's context for gpt2.
DEFAULT_SEQ_LEN = {"tiny": 64, "small": 256, "gpt2": 1024}

MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed; beyond it torch raises
MAX_SIZE = 2**31 - 1  # batch, sequence and dimension sizes: more than any device holds, less than overflows



def check_tdp(v: float | None) -> float | None:
    """A rated power (W) for the energy estimate: positive and finite, or not given."""
    if v is not None and not (math.isfinite(v) and v > 0):
        raise ValueError(f"rated power must be a positive number of watts, got {v}")
    return v


def _yaml_off(v: object) -> object:
    return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false


def _seed(v: int) -> int:
    return _bounded("seed", v, 0, MAX_SEED)


# Field types that carry their rule, so a spec of lmprof train/infer and a sweep's check them alike.
EnergyMode = Annotated[Literal["auto", "off", "estimate"], BeforeValidator(_yaml_off)]
Seed = Annotated[int, AfterValidator(_seed)]
RatedWatts = Annotated[float | None, AfterValidator(check_tdp)]


class Checked(BaseModel):
    """Rules every run option shares, so they exist once: no true/false where a number is meant."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(v, bool) and field is not None and _is_number(field.annotation):
            raise ValueError(f"expected a number, got {str(v).lower()}")
        return v


def _is_number(annotation: object) -> bool:
    args = getattr(annotation, "__args__", None)
    if args:
        return all(a in (int, float, type(None)) for a in args) and any(a in (int, float) for a in args)
    return annotation in (int, float)


_Name = TypeVar("_Name", bound=str)


def choice(value: str, options: tuple[_Name, ...], message: str) -> _Name:
    """``value`` as one of ``options`` (typed as they are, e.g. a Literal), or ConfigError(message)."""
    for option in options:
        if value == option:
            return option
    raise ConfigError(message)


_Count = TypeVar("_Count", int, int | None)  # a required or an optional whole number


_DEVICE_SPEC = re.compile(r"auto|cpu|mps|cuda(:\d{1,4})?")


def check_device_spec(spec: str | None) -> str:
    """``spec`` lowercased, or DeviceError unless it reads auto, cpu, cuda, cuda:N or mps. Torch-free, so
    a mistyped device is refused before torch is imported; whether the device is present is
    :func:`lmprof.hardware.devices.resolve_device`'s question."""
    s = (spec or "auto").strip().lower()
    if not _DEVICE_SPEC.fullmatch(s):
        raise DeviceError(f"unknown device {s!r}: use auto, cpu, cuda, cuda:N or mps")
    return s


MAX_RANKS = 4096  # --nproc: more ranks than any one launch lmprof supports


def check_nproc(nproc: int) -> None:
    """ConfigError unless ``--nproc`` is a rank count lmprof launches (``lmprof run`` checks it so too)."""
    try:
        _bounded("--nproc", nproc, 1, MAX_RANKS)
    except ValueError as exc:
        raise ConfigError(f"--nproc {exc}") from None


# What a size is called when it is not positive (the field's name says the rest).
_SIZES = {"batch_size": "batch size", "seq_len": "sequence length", "new_tokens": "new tokens",
          "prompt_len": "prompt length"}


def _check_size(v: _Count, info: ValidationInfo) -> _Count:
    """A size of the workload: positive, and below :data:`MAX_SIZE`."""
    if v is not None and v <= 0:
        raise ValueError(f"{_SIZES.get(info.field_name or '', 'size')} must be positive, got {v}")
    return _bounded(info.field_name or "size", v, 1, MAX_SIZE)


def _bounded(name: str, v: _Count, low: int, high: int) -> _Count:
    if v is not None and not low <= v <= high:
        got = f"{v:,}" if abs(v) < 10**30 else f"a {len(str(abs(v)))}-digit number"
        raise ValueError(f"must be between {low} and {high:,}, got {got}")
    return v


def _checked_count(v: _Count, info: ValidationInfo, *, zero_steps: bool) -> _Count:
    problem = None if v is None else count_error(info.field_name or "steps", v, zero_steps=zero_steps)
    if problem:
        raise ValueError(problem)
    return v


class Asked(TypedDict, total=False):
    """The counts a spec gave, by field name."""

    warmup: int
    steps: int
    profile_steps: int


class AskedCounts(Checked):
    """The protocol's counts as a spec asks for them (a sweep, a sweep's point); None: the table's
    (lmprof/counts.py), and the rule of lmprof/counts.py on what is given."""

    ZERO_STEPS: ClassVar[bool] = False  # whether no clean window may be asked for (counts.fewest)

    warmup: int | None = None
    steps: int | None = None
    profile_steps: int | None = None

    @field_validator("warmup", "steps", "profile_steps")
    @classmethod
    def _count(cls, v: int | None, info: ValidationInfo) -> int | None:
        return _checked_count(v, info, zero_steps=cls.ZERO_STEPS)

    def asked(self) -> Asked:
        """The counts given, by field name: what a point passes on to its run."""
        given = Asked()
        if self.warmup is not None:
            given["warmup"] = self.warmup
        if self.steps is not None:
            given["steps"] = self.steps
        if self.profile_steps is not None:
            given["profile_steps"] = self.profile_steps
        return given


class ModelSpec(Checked):
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

    @field_validator("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
    @classmethod
    def _dims(cls, v: int | None, info: ValidationInfo) -> int | None:
        return _bounded(info.field_name or "size", v, 1, MAX_SIZE)

    def label(self) -> str:
        """A short name for run folders: the HF model or the preset."""
        return (self.hf or self.hf_config or self.preset).replace("/", "_").strip("._") or "model"


class MeasureSpec(Checked):
    """How figures are taken: the same protocol for every mode."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = DEFAULT_COUNTS["train"].warmup  # the one table of defaults (lmprof/counts.py)
    steps: int = DEFAULT_COUNTS["train"].steps
    profile_steps: int = DEFAULT_COUNTS["train"].profile_steps
    device: str = "auto"
    dtype: Dtype = "fp32"
    compile: bool = False
    compile_mode: CompileMode = "default"  # torch.compile's mode, used with compile
    energy: EnergyMode = "auto"
    tdp_w: RatedWatts = None  # rated power for --energy estimate
    idle_s: float = 1.0  # idle baseline before warm-up, when a real meter exists
    # per-run PNGs (roofline, memory timeline): most of a second of matplotlib, so off unless asked;
    # the CLI asks with the report, --log-to or --plots (cli.measuring.Measuring.values)
    plots: bool = False
    seed: Seed = 0
    force: bool = False  # run even when the steps asked for would take longer than lmprof.pipeline.budget allows

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        try:
            check_device_spec(v)
        except DeviceError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("idle_s")
    @classmethod
    def _idle(cls, v: float) -> float:
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"must be a finite number of seconds >= 0, got {v}")
        return v

    @field_validator("warmup", "steps", "profile_steps")
    @classmethod
    def _count(cls, v: int, info: ValidationInfo) -> int:
        return _checked_count(v, info, zero_steps=False)


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

    @field_validator("batch_size", "seq_len")
    @classmethod
    def _size(cls, v: int | None, info: ValidationInfo) -> int | None:
        return _check_size(v, info)

    @field_validator("nproc")
    @classmethod
    def _nproc(cls, v: int) -> int:
        return _bounded("--nproc (ranks)", v, 1, MAX_RANKS)

    @field_validator("data")
    @classmethod
    def _data(cls, v: str | None) -> str | None:
        if v is not None:
            check_input_file(v, "data file")
        return v


def check_input_file(path: str | Path, what: str) -> Path:
    """``path`` must be a regular file we can read; otherwise one line saying what it is instead."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{what} not found: {p}")
    if not p.is_file():
        raise DataError(f"{what} {p} is {_kind_of(p)}, not a regular file")
    if not os.access(p, os.R_OK):
        raise DataError(f"{what} {p} is not readable (permission denied)")
    return p


def _kind_of(p: Path) -> str:
    import stat

    mode = p.stat().st_mode
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


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
    """Read a YAML config file into a dict (empty when no path); bounded (see :mod:`lmprof.safeyaml`)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.exists():
        raise DataError(f"config file not found: {p}")
    data = load_file(p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


class InferConfig(ModelSpec, MeasureSpec):
    """Everything ``lmprof infer`` needs."""

    prompt: str | None = None
    prompt_ids: list[int] | None = None  # token ids as given (the lesson's tokens without a tokenizer)
    tokenizer: str | None = None  # a local tokenizer folder that encodes --prompt
    prompt_len: int = 32
    batch_size: int = 1
    new_tokens: int = 50
    kv_cache: bool = True
    steps: int = DEFAULT_COUNTS["infer"].steps
    warmup: int = DEFAULT_COUNTS["infer"].warmup
    profile_steps: int = DEFAULT_COUNTS["infer"].profile_steps
    out: str = "runs"

    @field_validator("prompt_ids")
    @classmethod
    def _ids(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("prompt ids are empty")
        return [_bounded("prompt id", x, 0, MAX_SIZE) for x in v]

    @field_validator("batch_size", "prompt_len", "new_tokens")
    @classmethod
    def _size(cls, v: int, info: ValidationInfo) -> int:
        return _check_size(v, info)
