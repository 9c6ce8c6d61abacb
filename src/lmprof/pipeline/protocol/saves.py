"""Which steps save a checkpoint: ``torch.save`` patched while a window watches the steps."""
from __future__ import annotations

from typing import Any, Callable

import torch

from lmprof.patch import Patch


def save_spy(on_save: Callable[[], None]) -> Patch:
    """``torch.save``, calling ``on_save`` first: a step that saves a checkpoint (nanoGPT's, the HF Trainer's
    ``save_steps``, Lightning's all go through it)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def save(*args: Any, **kwargs: Any) -> Any:
            on_save()
            return original(*args, **kwargs)

        return save

    return Patch(torch, "save", wrap)
