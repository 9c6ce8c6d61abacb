"""A run's mode, training or inference, and what differs between the two, said once.

Bottom layer (the vocabulary). run.json keeps the mode as the string ``"train"`` or ``"infer"``
(docs/run-format.md); code that acts differently for the two asks the mode's :class:`Traits`
(``traits(run.mode).trains``, ``.unit``, ``.phases``) instead of comparing the strings. The figures
that differ by mode (the clean timing, the profiled one, the throughput) are the metric
catalogue's to pick (``lmprof.record.catalogue``); the passes FLOPs are counted over, and the block
phases each pass covers, are in ``names.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmprof.names import INFER_PHASES, TRAIN_PHASES

Mode = Literal["train", "infer"]
MODES: tuple[Mode, ...] = ("train", "infer")


@dataclass(frozen=True)
class Traits:
    """What a mode is made of, for the code that acts on it."""

    mode: Mode
    # A backward pass and an optimizer step: gradients, optimizer state and the activations saved for
    # backward exist, tokens are trained on. Otherwise: generations, a prefill then decode steps over a KV cache.
    trains: bool
    unit: str  # one timed repetition, in messages and notes: "step" / "generation"
    token: str  # what its throughput counts: "token" (trained on) / "generated token"
    article: str  # "a train run", "an infer run"
    phases: tuple[str, ...]  # the phases its blocks are timed in (names.py)
    passes: tuple[str, ...]  # the passes its FLOPs, bytes and utilisation are given for (names.PASS_PHASES)

    @property
    def generates(self) -> bool:
        """Generations (prefill + decode over a KV cache) rather than training steps."""
        return not self.trains


_TRAITS: dict[str, Traits] = {
    "train": Traits("train", trains=True, unit="step", token="token", article="a", phases=TRAIN_PHASES,
                    passes=("train",)),
    "infer": Traits("infer", trains=False, unit="generation", token="generated token", article="an",
                    phases=INFER_PHASES, passes=INFER_PHASES),
}


def traits(mode: str) -> Traits:
    """The traits of ``mode`` (``"train"`` or ``"infer"``); ValueError for any other string."""
    try:
        return _TRAITS[mode]
    except KeyError:
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}") from None
