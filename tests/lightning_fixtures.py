"""A tiny LightningModule for the tracker tests (Lightning imported only by the tests that build it)."""
from __future__ import annotations

from typing import Any


def tiny_module() -> Any:
    """A two-layer MLP LightningModule that logs ``train_loss`` each step, with SGD."""
    import pytorch_lightning as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (x,) = batch
            loss = self.net(x).pow(2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny()
