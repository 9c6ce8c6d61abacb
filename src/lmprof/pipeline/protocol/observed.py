"""What a session knows of the code it measures: the model, where it runs, and what its steps showed.

A driver that owns its loop (``lmprof train`` / ``infer``) describes its workload up front
(:class:`Known`); for someone else's loop the same facts are read off the model once the run is
over (:func:`model_facts`): as the profiled window completes, never inside a measured step.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from lmprof.dtypes import normalize_dtype
from lmprof.errors import ConfigError
from lmprof.estimate.shape import ModelShape
from lmprof.hardware.devices import Device, resolve_device
from lmprof.measure.model_facts.quantized import Quantized, quantized
from lmprof.measure.other_models import Beside
from lmprof.workloads.hf_interface import attention_implementation
from lmprof.workloads.hooks import compiled_inside, takes_hooks
from lmprof.workloads.stepping import params as stepped_params


@dataclass
class Known:
    """What a driver knows of its workload (lmprof train / infer); a user's script leaves it None
    and the same facts are read off the model it observes."""

    title: str
    dtype: str
    param_dtype: str
    shape: Any = None
    batch: int | None = None
    seq_len: int | None = None
    attention: Literal["math", "sdpa"] = "math"
    optimizer: str | None = None
    dropout: Any = 0.0
    tokens_per_step: int | None = None
    new_tokens: int = 0
    kv_cache: bool = True
    cache_bytes: int | None = None  # the KV cache after a generation, as the driver's decoder holds it
    # A generation's prefill computed logits at its last position only (None: the model's own convention)
    last_logits_only: bool | None = None
    tf32: bool = False  # fp32 matmuls ran on CUDA's TF32 tensor cores: MFU against the TF32 peak


@dataclass
class Observed:
    """The model a session watches and what it saw of the steps; filled as the steps run."""

    model: torch.nn.Module | None = None
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    device: Device | None = None
    compiled: bool = False
    notes: list[str] = field(default_factory=list)
    input_shape: tuple[int, ...] | None = None
    backwards_per_step: float | None = None
    forwards_per_step: float | None = None
    batches_per_step: float | None = None  # distinct inputs per step (probes.py: Probes._count_batch)
    tokens_per_step: float | None = None  # the token ids in them
    generations_without_forward: int = 0  # generations in which the model's hooks saw no forward
    # The figures step's backward recomputed checkpointed activations (measure/held.py); None: not seen
    recomputes: bool | None = None
    # Other models the figures step ran forwards of (measure/other_models.py); None: not watched
    others: list[Any] | None = None
    # The loop re-created its optimizer (triggers.py): the replaced one's class, and the steps counted by then
    optimizer_replaced: tuple[str, int] | None = None
    # Where a compiled model takes a hook outside its compiled code (torch.compile's OptimizedModule, or the
    # model itself when only parts of it are compiled): it sees each call's input without a recompilation
    # (windows/shapes.py)
    outer: torch.nn.Module | None = None
    trains: bool = True  # the session measures training steps (frozen weights change their FLOPs)
    # Why neither lmprof's formulas nor a model read off the meta device from the config describe the model as
    # it runs (frozen weights, adapters, layers added or removed); None: nothing seen (departure.py)
    departs: str | None = None
    # The optimizer whose steps end the loop's steps never stepped while others did (triggers.py): which, for
    # the message of a run that measured nothing; None: not so
    unstepped: str | None = None
    quantized: Quantized | None = None  # how its weights are quantized; None: they are not
    _beside: Beside | None = field(default=None, repr=False)
    _shape: ModelShape | None = field(default=None, repr=False)
    _described: bool = field(default=False, repr=False)

    def attach(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None, compiled: bool,
               device: Device | None = None, outer: torch.nn.Module | None = None) -> None:
        """The model whose blocks are scoped, and where it runs (``device``, else its parameters');
        ``outer``: the module the loop calls, kept where it is a compiled model's wrapper."""
        self.model, self.optimizers, self.compiled = model, list(optimizers or []), compiled
        # The module whose hooks run outside the compiled code: torch.compile's wrapper, or the model itself
        # where only parts of it are compiled (its forward replaced, Module.compile() on its layers)
        in_place = compiled_inside(model) and getattr(model, "_compiled_call_impl", None) is None
        self.outer = (outer if compiled and outer is not None and outer is not model
                      else model if compiled and in_place else None)
        if not takes_hooks(model):
            self.notes.append("TorchScript: the model is a ScriptModule, which takes no hooks, so lmprof placed none: "
                              "its forward is not split into blocks (operators, phases after the forward, and the "
                              "step's figures are measured as usual)")
        p = next(model.parameters(), None)
        self.device = device or resolve_device(str(p.device) if p is not None else "cpu")

    def detach(self) -> None:
        """Forget the model and what was read off it (:meth:`attach` of another follows)."""
        self.model, self.optimizers, self.compiled, self.outer, self.device = None, [], False, None, None
        self._beside, self._shape, self._described = None, None, False

    def beside(self) -> Beside | None:
        """The other models beside the observed one, found once a session (None: no model yet)."""
        if self.model is None:
            return None
        if self._beside is None or self._beside.model is not self.model:
            self._beside = Beside(self.model, lambda: self.optimizers)
        return self._beside

    def sync(self) -> None:
        """Wait for the device's queued work (nothing before a model is attached)."""
        if self.device is not None:
            self.device.synchronize()

    def counted(self, probes: Any, steps: int) -> None:
        """What the probes counted over ``steps`` recorded training steps, per step."""
        if probes.backwards:
            self.backwards_per_step = probes.backwards / steps
        if probes.forwards:
            self.forwards_per_step = probes.forwards / steps
        if probes.batches:
            self.batches_per_step = probes.batches / steps
            self.tokens_per_step = probes.tokens / steps if probes.tokens else None
        direct = ("the loop calls model.forward(...) itself, which runs none of the model's own hooks: the forward "
                  "phase opens at its first submodule, and the model's own code outside its submodules and the loss "
                  "are not told apart (both in the forward's 'other'); model(...) runs them")
        if probes.direct and direct not in self.notes:
            self.notes.append(direct)

    def shape(self) -> ModelShape | None:
        """lmprof's description of the model (None when it has none, or when the model departs from the one its
        config describes: :attr:`departs` says how); looked up once, from the first warm-up step that asks."""
        if not self._described:
            from lmprof.measure.model_facts.departure import departure
            from lmprof.workloads.describe import describe_module, inner_module

            shape = describe_module(self.model) if self.model is not None else None
            if self.model is not None:
                with contextlib.suppress(Exception):  # a model whose parameters cannot be listed: read as built
                    self.quantized = quantized(inner_module(self.model))
                    self.departs = departure(self.model, shape.n_params() if shape is not None else None,
                                             trains=self.trains, hidden=self.quantized.hidden if self.quantized else 0)
            self._shape = None if self.departs else shape
            self._described = True
        return self._shape


@dataclass(frozen=True)
class ModelFacts:
    """The model's facts a run records, read once the run is over."""

    name: str
    params: int | None
    dtype: str | None
    model_type: str | None
    attention_impl: str | None  # what transformers says it runs (eager, sdpa, ...)
    attention: Literal["math", "sdpa"]  # which of lmprof's formulas describes it
    dropout: Any
    shape: ModelShape | None
    optimizer: str | None
    config: dict[str, Any] | None = None  # a Hugging Face model's config.json, for the describer (no formulas)
    departs: str | None = None  # Observed.departs: why neither the formulas nor the describer fit the model
    quantized: Quantized | None = None  # Observed.quantized
    # Whether the optimizers keep an fp32 master copy of 16-bit parameters (None: fp32 parameters, or not seen):
    # False where they step the model's own parameters, whose moments torch's optimizers keep in their dtype
    master_weights: bool | None = None


def master_copy(model: torch.nn.Module | None, optimizers: list[torch.optim.Optimizer]) -> bool | None:
    """:attr:`ModelFacts.master_weights`, from what the optimizers step: the model's own 16-bit parameters (no
    master copy), or fp32 tensors none of which is the model's (a master copy the loop keeps, as apex O2 and
    DeepSpeed's bf16 optimizer do)."""
    params = list(model.parameters()) if model is not None else []
    if not params or not optimizers or all(p.dtype == torch.float32 for p in params):
        return None
    own = {id(p) for p in params}
    stepped = [p for o in optimizers for p in stepped_params(o)]
    if stepped and all(id(p) in own for p in stepped):
        return False
    if stepped and all(id(p) not in own and p.dtype == torch.float32 for p in stepped):
        return True
    return None


def dtype_of(model: torch.nn.Module | None) -> str | None:
    p = next(model.parameters(), None) if model is not None else None
    if p is None:
        return None
    try:
        return normalize_dtype(p.dtype)  # the record's names (fp64, fp32, ...), never torch's spelling
    except ConfigError:
        return str(p.dtype).removeprefix("torch.")  # a dtype with no peak: named as torch names it


def model_name(model: torch.nn.Module | None) -> str:
    if model is None:
        return "unknown model"
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return name if name else type(model).__name__


def model_facts(seen: Observed) -> ModelFacts:
    """Read the run's facts off the observed model (after the user's call returned)."""
    from lmprof.workloads.describe import attention_path, dropout_of
    from lmprof.workloads.hf import config_dict

    model = seen.model
    shape = seen.shape() if model is not None else None
    return ModelFacts(
        name=model_name(model),
        # quantized weights at their logical shape (packed ones are not parameters of it)
        params=(sum(p.numel() for p in model.parameters()) + (seen.quantized.hidden if seen.quantized else 0)
                if model is not None else None),
        dtype=dtype_of(model),
        model_type=getattr(getattr(model, "config", None), "model_type", None) or None,
        attention_impl=attention_implementation(model) if model is not None else None,
        attention=attention_path(model) if model is not None else "math",
        dropout=dropout_of(model) if model is not None else 0.0,
        shape=shape,
        optimizer=optimizer_name(seen.optimizers),
        config=None if seen.departs else config_dict(model),
        departs=seen.departs,
        quantized=seen.quantized,
        master_weights=master_copy(model, seen.optimizers),
    )


def optimizer_name(optimizers: list[torch.optim.Optimizer]) -> str | None:
    """The optimizer the memory estimate models: the class of them all (two AdamWs, one per group of
    weights, are AdamW); several classes (Muon and AdamW) are named together, which no formula models."""
    names = list(dict.fromkeys(type(o).__name__.lower() for o in optimizers))
    return "+".join(names) if names else None

