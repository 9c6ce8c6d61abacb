"""Profilers for training frameworks, loaded only when the framework is installed.

``lmprof.integrations.TrainerCallback``: a Hugging Face ``transformers`` Trainer callback (the Trainer
owns the loop, so a callback is where its steps can be seen).
``lmprof.integrations.LightningCallback``: the same for a Lightning Trainer (``pytorch_lightning`` or
``lightning``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["LightningCallback", "TrainerCallback"]


def __getattr__(name: str) -> Any:
    if name == "TrainerCallback":
        try:
            from lmprof.integrations.hf_trainer import TrainerCallback
        except ImportError as exc:
            if "transformers" not in str(exc):
                raise
            from lmprof.errors import ConfigError

            raise ConfigError("lmprof.integrations.TrainerCallback needs transformers (pip install 'lmprof[hf]')") from None
        return TrainerCallback
    if name == "LightningCallback":
        try:
            from lmprof.integrations.lightning import LightningCallback
        except ImportError as exc:
            if "lightning" not in str(exc):
                raise
            from lmprof.errors import ConfigError

            raise ConfigError("lmprof.integrations.LightningCallback needs pytorch-lightning "
                              "(pip install 'lmprof[lightning]')") from None
        return LightningCallback
    raise AttributeError(name)
