"""A training framework that compiles the model it trains, with lmprof's callback watching.

``Trainer(args=TrainingArguments(torch_compile=True))`` hands its callbacks the model and trains
accelerate's ``torch.compile`` wrapper of it; ``lightning.Trainer.fit(torch.compile(module))`` compiles the
module's ``training_step`` in place. Both times lmprof took the model for an eager one and hooked it, the
hooks were traced, and dynamo compiled again: 6 graphs where the Trainer alone compiles 2, 7 where
Lightning alone does, with profiled steps 9-12x the clean ones. Truth: dynamo's own count of the graphs it
compiled for the same training without lmprof.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lazy_imports import missing

pytest.importorskip("transformers")
B, T = 4, 16


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0,
                                      eos_token_id=0))


def _graphs(train: Any) -> int:
    """Graphs dynamo compiled while ``train()`` ran."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train()
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.slow
def test_trainer_torch_compile_compiles_as_alone_and_keeps_its_flops(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from lmprof.integrations import TrainerCallback
    from lmprof.record.catalogue import FLOPS_MODEL, MFU

    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 128, (64, T))]
    callbacks: list[Any] = []

    def train() -> None:
        args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=B, max_steps=8,
                                 report_to=[], use_cpu=True, torch_compile=True, torch_compile_backend="eager",
                                 save_strategy="no", disable_tqdm=True, logging_steps=1000)
        Trainer(model=_gpt2(), args=args, train_dataset=data, callbacks=callbacks).train()

    alone = _graphs(train)
    cb = TrainerCallback(out=tmp_path / "runs", warmup=2, steps=2, profile_steps=1, report=False, verbose=False)
    callbacks.append(cb)
    assert _graphs(train) == alone
    run = cb.run
    assert run is not None and run.metrics[FLOPS_MODEL].value  # the wrapper's hook, outside the compiled code
    assert run.metrics[MFU].value is not None


@missing("pytorch_lightning", "the lightning extra is not installed")
@pytest.mark.slow
def test_lightning_fit_of_a_compiled_module_compiles_as_alone(tmp_path: Path) -> None:
    import pytorch_lightning as pl

    from lmprof.integrations import LightningCallback

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2()

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            (x,) = batch
            return self.model(x, labels=x).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randint(0, 128, (64, T))), batch_size=B)
    callbacks: list[Any] = []

    def train() -> None:
        trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        trainer.fit(torch.compile(LM(), backend="eager"), loader)

    alone = _graphs(train)
    cb = LightningCallback(out=tmp_path / "runs", warmup=2, steps=2, profile_steps=1, report=False, verbose=False)
    callbacks.append(cb)
    assert _graphs(train) == alone
    run = cb.run
    assert run is not None
    assert any("no FLOP count for a compiled model" in n for n in run.notes), run.notes  # no hook inside to see it
