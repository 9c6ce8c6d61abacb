"""The sweep spec: a YAML grid of lists, validated, expanded into points with stable ids.

A spec names lists (``models``, ``batch_sizes``, ``seq_lens``, ``devices``, ``dtypes``, ``compile``,
``attention``, ``modes``); the sweep is their Cartesian product, minus the points that match an
``exclude`` rule, each point repeated ``repeats`` times. Scalars (``steps``, ``warmup``, ...) apply to
every point. A ``models`` entry is a preset, dimensions on a preset, or a Hugging Face architecture
(``hf_config``, what ``lmprof train --hf-config`` takes). A spec with ``script:`` is a sweep over a
user's script instead (:mod:`lmprof.sweep.script`). See docs/sweeps.md for the reference.

Every problem is one :class:`ConfigError` line naming the key, e.g.
``quick.yaml: batch_sizes: must not be empty``.
"""
from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import (ConfigDict, TypeAdapter, ValidationError, field_validator,
                      model_validator)

from lmprof.errors import ConfigError, LmprofError
from lmprof.config import AskedCounts, Checked, Dtype, EnergyMode, RatedWatts, Seed, load_yaml
from lmprof.safeyaml import short_repr
# MAX_POINTS: the default grid bound (a spec raises it with `max_points: N`), shared with script sweeps
from lmprof.sweep.plan import Plan, check_rules, listed, matches, positive_seconds
from lmprof.modes import Mode, traits
from lmprof.sweep.script import MAX_POINTS, ScriptPoint, ScriptSweepSpec

AttentionImpl = Literal["math", "sdpa"]

# The axes of the product, in the order they vary (last fastest), and the spec list behind each.
AXES: dict[str, str] = {
    "mode": "modes",
    "model": "models",
    "device": "devices",
    "dtype": "dtypes",
    "compile": "compile",
    "attention": "attention",
    "batch_size": "batch_sizes",
    "seq_len": "seq_lens",
}
_DIMENSIONS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
MAX_EXCLUDE_RULES = 1_000


class ModelEntry(Checked):
    """One entry of ``models``: a preset name, explicit dimensions on top of a preset, or a Hugging Face
    architecture with random weights (``hf_config``: what ``lmprof train --hf-config`` takes)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    preset: str | None = None
    hf_config: str | None = None  # a known name or a config.json / folder path (as lmprof train reads it)
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None
    vocab_size: int | None = None

    @model_validator(mode="after")
    def _complete(self) -> "ModelEntry":
        if self.hf_config is not None:
            # The train path's rule (workloads.builders._load_hf): only the layer count resizes an architecture.
            given = [k for k in ("preset", "n_head", "n_embd", "block_size", "vocab_size") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"hf_config takes only name and n_layer, not {given[0]} (heads, width and "
                                 "vocabulary follow the architecture, as with lmprof train --hf-config)")
            if self.n_layer is not None and self.n_layer <= 0:
                raise ValueError(f"n_layer must be positive, got {self.n_layer}")
            return self
        if self.preset is None and None in (self.n_layer, self.n_head, self.n_embd):
            missing = [k for k in ("n_layer", "n_head", "n_embd") if getattr(self, k) is None]
            raise ValueError(
                f"a model without a preset needs n_layer, n_head and n_embd (missing {', '.join(missing)})")
        for key in _DIMENSIONS:
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ValueError(f"{key} must be positive, got {value}")
        return self

    @property
    def label(self) -> str:
        """The name plots and tables use: ``name``, else the preset, else ``L<layers>-H<heads>-E<width>``."""
        if self.name:
            return self.name
        if self.hf_config is not None:
            return self.hf_config + (f"-L{self.n_layer}" if self.n_layer is not None else "")
        overrides = any(getattr(self, k) is not None for k in _DIMENSIONS)
        if self.preset and not overrides:
            return self.preset
        base = f"L{self.n_layer}-H{self.n_head}-E{self.n_embd}"
        return f"{self.preset}-{base}" if self.preset else base

    def resolved(self) -> dict[str, Any]:
        """Preset plus overrides as explicit dimensions (the preset's values fill what is not given).

        Divisibility (n_embd by n_head) is deliberately not checked here: an impossible shape is a
        per-point ``error`` at run time, like any other failure, and the rest of the sweep goes on.
        A Hugging Face entry is the ``hf_config`` (and ``n_layer``) a TrainConfig / InferConfig takes.
        """
        if self.hf_config is not None:
            return {"hf_config": self.hf_config, **({"n_layer": self.n_layer} if self.n_layer is not None else {})}
        from lmprof.workloads.gpt_config import PRESETS

        base = PRESETS[self.preset or "tiny"]
        out: dict[str, Any] = {"preset": self.preset or "tiny"}
        for key in _DIMENSIONS:
            value = getattr(self, key)
            out[key] = getattr(base, key) if value is None else value
        return out


class Point(AskedCounts):
    """One run of the sweep: everything the worker needs, nothing about how it is scheduled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode
    model: str
    model_spec: dict[str, Any]
    batch_size: int
    seq_len: int
    device: str
    dtype: Dtype
    compile: bool
    attention: AttentionImpl
    new_tokens: int
    energy: EnergyMode
    seed: int
    data: str | None = None
    repeat: int = 0
    tdp_w: float | None = None  # rated power for energy: estimate (None: left out of the id's hash)

    @property
    def id(self) -> str:
        """12 hex digits of a hash of the whole config: the same point gets the same id in every sweep.

        Unset (None) fields are left out of the hash, so adding an optional field later keeps the ids
        of existing sweeps, and ``--resume`` keeps working across versions.
        """
        blob = json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        """A short human description, e.g. ``train tiny b4 t64 cpu fp32 sdpa``."""
        parts = [self.mode, self.model, f"b{self.batch_size}", f"t{self.seq_len}", self.device, self.dtype,
                 self.attention]
        if self.compile:
            parts.append("compile")
        if self.repeat:
            parts.append(f"#{self.repeat + 1}")
        return " ".join(parts)

    def run_values(self, out: str) -> dict[str, Any]:
        """Values for ``TrainConfig`` / ``InferConfig`` (validated by the worker with ``build``)."""
        values: dict[str, Any] = dict(self.model_spec)
        values.update(
            batch_size=self.batch_size, device=self.device, dtype=self.dtype, compile=self.compile,
            attention=self.attention, energy=self.energy, seed=self.seed, out=out,
        )
        if self.tdp_w is not None:
            values["tdp_w"] = self.tdp_w
        values.update(self.asked())
        if traits(self.mode).trains:
            values["seq_len"] = self.seq_len
            if self.data:
                values["data"] = self.data
        else:
            values["prompt_len"] = self.seq_len  # inference's sequence is the prompt
            values["new_tokens"] = self.new_tokens
        return values


class SweepSpec(AskedCounts):
    """The validated spec. Lists are the product's axes; scalars apply to every point."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelEntry] = [ModelEntry(preset="tiny")]
    batch_sizes: list[int] = [8]
    seq_lens: list[int] = [64]
    devices: list[str] = ["auto"]
    dtypes: list[Dtype] = ["fp32"]
    compile: list[bool] = [False]
    attention: list[AttentionImpl] = ["math"]
    modes: list[Mode] = ["train"]
    repeats: int = 1
    timeout_s: float = 600.0
    new_tokens: int = 16
    energy: EnergyMode = "auto"
    tdp_w: RatedWatts = None  # rated power in watts, needed by energy: estimate
    seed: Seed = 0
    data: str | None = None
    exclude: list[dict[str, Any]] = []
    max_points: int = MAX_POINTS  # the grid's bound (points x repeats): a typo must not queue a million runs

    @field_validator("models", "batch_sizes", "seq_lens", "devices", "dtypes", "compile", "attention", "modes",
                     mode="before")
    @classmethod
    def _listify(cls, v: object) -> object:
        # A single value is a one-element list: `compile: true` reads naturally.
        if v is None:
            raise ValueError("must be a list of values, got nothing")
        return v if isinstance(v, list) else [v]

    @field_validator("models", mode="before")
    @classmethod
    def _model_names(cls, v: list[object]) -> list[object]:
        return [{"preset": m} if isinstance(m, str) else m for m in v]

    @field_validator("models", "batch_sizes", "seq_lens", "devices", "dtypes", "compile", "attention", "modes")
    @classmethod
    def _non_empty_unique(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("must not be empty (give at least one value)")
        keys = [m.label if isinstance(m, ModelEntry) else m for m in v]
        dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"duplicate value {dupes[0]}")
        return v

    @field_validator("batch_sizes", "seq_lens", mode="before")
    @classmethod
    def _no_bool_sizes(cls, v: object) -> object:
        if isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v)):
            raise ValueError("expected numbers, got true/false")
        return v

    @field_validator("batch_sizes", "seq_lens")
    @classmethod
    def _positive_ints(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if not 0 < x < 2**31]
        if bad:
            raise ValueError(f"values must be positive (at most {2**31 - 1:,}), got {short_repr(bad[0], 40)}")
        return v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str]) -> list[str]:
        out = [str(d).strip().lower() for d in v]
        bad = [d for d in out if not _DEVICE.match(d)]
        if bad:
            raise ValueError(f"unknown device {bad[0]!r}: use auto, cpu, cuda, cuda:N or mps")
        return out

    @field_validator("repeats", "new_tokens")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1, got {v}")
        return v

    _timeout = field_validator("timeout_s")(positive_seconds)

    @field_validator("new_tokens", "repeats", "max_points")
    @classmethod
    def _not_astronomical(cls, v: int | None) -> int | None:
        if v is not None and v > 2**62:
            raise ValueError(f"must be at most {2**62:,}, got a {len(str(v))}-digit number")
        return v

    @field_validator("exclude", mode="before")
    @classmethod
    def _exclude(cls, v: object) -> object:
        rules = listed(v, "a list of rules such as {device: cpu, dtype: fp16}")
        if len(rules) > MAX_EXCLUDE_RULES:
            raise ValueError(f"{len(rules):,} rules, more than the {MAX_EXCLUDE_RULES:,} lmprof accepts: exclude whole "
                             "axis values with lists ({dtype: [fp16, bf16]}) instead")
        check_rules(rules, AXES, "axis", hint=lambda key: _hint(key, AXES))
        return rules

    @field_validator("models")
    @classmethod
    def _known_presets(cls, v: list[ModelEntry]) -> list[ModelEntry]:
        from lmprof.workloads.gpt_config import PRESETS

        for i, m in enumerate(v):
            if m.preset is not None and m.preset not in PRESETS:
                raise ValueError(f"entry {i}: unknown preset {m.preset!r}: choose one of {', '.join(PRESETS)}")
            if m.hf_config is not None:
                _check_hf_config(i, m)
        return v

    @model_validator(mode="after")
    def _estimate_needs_tdp(self) -> "SweepSpec":
        # Checked here, before anything runs: otherwise every point would fail the same way.
        if self.energy == "estimate" and self.tdp_w is None:
            raise ValueError("energy: estimate needs the device's rated power: add tdp_w: <watts> to the spec")
        return self

    @model_validator(mode="after")
    def _bounded_grid(self) -> "SweepSpec":
        sizes = [len(getattr(self, key)) for key in AXES.values()]
        total = math.prod(sizes) * self.repeats
        if total > self.max_points:
            raise ValueError(
                f"the grid has {total:,} points ({math.prod(sizes):,} combinations x {self.repeats:,} repeats), more than "
                f"max_points ({self.max_points:,}): shrink the lists, or set max_points: {total} in the spec "
                "if you mean it")
        return self

    # -- expansion -----------------------------------------------------------------------------
    def axis_values(self) -> dict[str, list[Any]]:
        """Each product axis with its values (``model`` as labels)."""
        values = {axis: list(getattr(self, key)) for axis, key in AXES.items()}
        values["model"] = [m.label for m in self.models]
        return values

    def expand(self) -> Plan[AnyPoint]:
        """The product, minus excluded points, times ``repeats``, in a stable order."""
        entries = {m.label: m for m in self.models}
        resolved = {label: m.resolved() for label, m in entries.items()}
        axes = self.axis_values()
        kept: list[AnyPoint] = []
        excluded = 0
        used = [0] * len(self.exclude)
        for combo in itertools.product(*axes.values()):
            where = dict(zip(axes, combo))
            hits = [i for i, rule in enumerate(self.exclude) if matches(rule, where)]
            for i in hits:
                used[i] += 1
            if hits:
                excluded += 1
                continue
            for r in range(self.repeats):
                kept.append(Point(
                    mode=where["mode"], model=where["model"], model_spec=resolved[where["model"]],
                    batch_size=where["batch_size"], seq_len=where["seq_len"], device=where["device"],
                    dtype=where["dtype"], compile=where["compile"], attention=where["attention"],
                    **self.asked(), new_tokens=self.new_tokens, energy=self.energy, seed=self.seed, tdp_w=self.tdp_w,
                    data=self.data if traits(where["mode"]).trains else None, repeat=r,
                ))
        unused = [self.exclude[i] for i, n in enumerate(used) if n == 0]
        return Plan(points=kept, excluded=excluded, unused_rules=unused)


def _check_hf_config(i: int, entry: ModelEntry) -> None:
    """Resolve an entry's architecture now, with the resolver ``lmprof train --hf-config`` uses, so an
    unknown name, a missing file or a missing transformers is one line before anything runs."""
    from lmprof.workloads import hf as hfmod  # lazy: imports torch and transformers

    try:
        hfmod.config_for(str(entry.hf_config), num_hidden_layers=entry.n_layer)
    except LmprofError as exc:
        raise ValueError(f"entry {i}: hf_config: {exc}") from None


AnyPoint = Union[Point, ScriptPoint]  # what a sweep runs: a built-in/HF model point or a script's
POINT = TypeAdapter(AnyPoint)


def parse_point(text: str) -> AnyPoint:
    """A point from its JSON (point.json): a script point has ``script``, any other a ``model_spec``."""
    point: AnyPoint = POINT.validate_json(text)
    return point


def _hint(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


AnySpec = Union[SweepSpec, ScriptSweepSpec]


def parse_spec(values: dict[str, Any], where: str = "spec") -> AnySpec:
    """Validate a spec mapping (``script:`` makes it a script sweep); any problem is one ConfigError
    line naming the key."""
    cls: type[SweepSpec] | type[ScriptSweepSpec] = ScriptSweepSpec if "script" in values else SweepSpec
    known = list(cls.model_fields)
    for key in values:
        if key not in known:
            kind = "a script sweep's keys" if cls is ScriptSweepSpec else "known keys"
            raise ConfigError(f"{where}: unknown key {key!r}{_hint(key, known)} ({kind}: {', '.join(known)})")
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key"
        if not loc and cls is ScriptSweepSpec:  # its whole-spec rules name their key in the message
            raise ConfigError(f"{where}: {msg}") from None
        raise ConfigError(f"{where}: {loc or 'spec'}: {msg}") from None


def load_spec(path: str | Path) -> AnySpec:
    """Read and validate a sweep spec YAML file."""
    return parse_spec(load_yaml(path), where=str(path))
