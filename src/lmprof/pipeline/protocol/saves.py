"""Which steps save a checkpoint: ``torch.save`` patched while a window watches the steps.

A step that saves a checkpoint (nanoGPT's, the HF Trainer's ``save_steps``, Lightning's: each goes through
``torch.save``) does known work that is not the training step's: the clean window leaves such a step out of
the step time, the whole-run watch takes it for no spike.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch


class SaveSpy:
    """Calls ``on_save`` whenever ``torch.save`` is called, from :meth:`install` to :meth:`remove`."""

    def __init__(self, on_save: Callable[[], None]):
        self.on_save = on_save
        self._original: Any = None

    def install(self) -> None:
        original = torch.save

        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            self.on_save()
            return original(*args, **kwargs)

        self._original, torch.save = original, save

    def remove(self) -> None:
        """``torch.save`` as it was (unless another patched it over this one: this one's then only calls
        ``on_save``, which a stopped window ignores)."""
        if self._original is not None:
            if getattr(torch.save, "__wrapped__", None) is self._original:
                torch.save = self._original  # type: ignore[assignment]  # what it was
            self._original = None
