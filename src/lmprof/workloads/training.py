"""What a training step is: a model, its optimizer, a batch source and the step with its scopes.

Any model comes in as a :class:`TrainWorkload` (the built-in GPT, a Hugging Face model or a user's
module); :class:`TrainStep` runs one step with a scope around each part, so the profiled phase can
tell data, forward, backward, optimizer and zero_grad apart. :func:`plain_train_step` is the same
step written as a user writes it (no autocast, no device moves, no sync), for measuring a model
outside a workload.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

import torch

from lmprof.hardware.devices import Device
from lmprof.workloads.blocks import step_scope
from lmprof.workloads.precision import TORCH_DTYPES
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.dropout import Dropout


@dataclass
class TrainWorkload:
    """What runs: a model, its optimizer, a batch source and how to get a loss from a batch."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Any]
    device: Device
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    tokens_per_step: int | None = None
    shape: ModelShape | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    attention: Literal["math", "sdpa"] = "math"
    optimizer_name: Literal["adamw", "sgd"] = "adamw"
    dropout: float | Dropout = 0.0  # one rate (built-in GPT) or by site (a Hugging Face config)
    describe: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Entered for the profiled phase only: module hooks that place block scopes in foreign models.
    scopes: Callable[[], contextlib.AbstractContextManager[Any]] | None = None


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a tensor, or tuples/lists/dicts of tensors, to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def autocast_for(device: Device, dtype: str) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """Mixed precision as users run it: fp32 parameters, 16-bit matmuls under torch.autocast."""
    if dtype == "fp32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.kind, dtype=TORCH_DTYPES[dtype])


def plain_train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, next_batch: Callable[[], Any],
                     loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> Callable[[], None]:
    """One plain training step with step-part scopes: data (``next_batch()``), forward (``loss_fn``),
    backward, optimizer, zero_grad. It keeps nothing alive between steps, so a step's bytes are the
    model's own (what a figures step's ``lmprof.measure.memory.MemoryWindow`` reads)."""

    def step() -> None:
        with step_scope("data"):
            batch = next_batch()
        with step_scope("forward"):
            loss = loss_fn(model, batch)
        with step_scope("backward"):
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        with step_scope("optimizer"):
            optimizer.step()
        with step_scope("zero_grad"):
            optimizer.zero_grad(set_to_none=True)

    return step


class TrainStep:
    """One training step with a scope around each part. Calling it runs a step and syncs the device."""

    def __init__(self, work: TrainWorkload, dtype: str):
        self.work = work
        self.amp = autocast_for(work.device, dtype)
        self.scaler = torch.amp.GradScaler("cuda") if (dtype == "fp16" and work.device.kind == "cuda") else None
        self._loss: torch.Tensor | None = None

    def __call__(self) -> None:
        w = self.work
        with step_scope("data"):
            batch = to_device(next(w.batches), w.device.torch_device)
        with step_scope("forward"):
            with self.amp():
                loss = w.loss_fn(w.model, batch)
        with step_scope("backward"):
            (self.scaler.scale(loss) if self.scaler else loss).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        with step_scope("optimizer"):
            if self.scaler:
                self.scaler.step(w.optimizer)
                self.scaler.update()
            else:
                w.optimizer.step()
        with step_scope("zero_grad"):
            w.optimizer.zero_grad(set_to_none=True)
        self._loss = loss.detach()
        w.device.synchronize()  # the step ends when the device is done (also under the profiler)

    def last_loss(self) -> float | None:
        """The last step's loss; reading it syncs, so call it only outside timed regions."""
        return None if self._loss is None else float(self._loss.float().item())
