"""One training step as the activation and peak formulas see it (:class:`TrainStep`)."""
from __future__ import annotations

from dataclasses import dataclass

from lmprof.estimate.dropout import Dropout
from lmprof.estimate.memory.result import Attention


@dataclass(frozen=True)
class TrainStep:
    """What decides the tensors one training step keeps: the batch, the precision, the attention path,
    the device and dropout.

    Passed whole from :func:`~lmprof.estimate.memory.estimate.estimate_memory` to the training
    estimate and on to :func:`~lmprof.estimate.memory.activations.activation_items`, which read the
    same seven settings. ``dtype`` is the compute dtype (``bf16``/``fp16`` with fp32 ``param_dtype``:
    autocast); ``dropout`` one rate for the built-in GPT or the rates by site (Hugging Face configs).
    """

    batch: int
    seq_len: int
    dtype: str = "fp32"
    param_dtype: str = "fp32"
    attention: Attention = "math"
    device_kind: str = "cuda"
    dropout: float | Dropout = 0.0

    @property
    def autocast(self) -> bool:
        """16-bit compute over fp32 parameters: lmprof's mixed precision (torch.autocast)."""
        return self.dtype != "fp32" and self.param_dtype == "fp32"

    @property
    def drops(self) -> Dropout:
        """The dropout rates by site (one rate spread over the built-in GPT's sites)."""
        return self.dropout if isinstance(self.dropout, Dropout) else Dropout.uniform(self.dropout)
