"""The Lightning callback on a tiny LightningModule: the same run folder as the Hugging Face Trainer callback.

Truth: hand counts. With gradient accumulation 2 a step is one optimizer step, so the forward
``attn.qkv`` scope is entered n_layer x 2 micro-batches times per step.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lazy_imports import Lazy, missing
from lmprof.record.run import Run

pytestmark = [missing("pytorch_lightning", "the lightning extra is not installed"),
              missing("transformers", "transformers is not installed")]
pl = Lazy("pytorch_lightning")  # imported by the test that runs, not by every worker's collection

N_LAYER, ACCUM, BATCH, SEQ = 2, 2, 4, 32


def TinyGPT() -> "pl.LightningModule":
    import transformers

    class TinyGPT(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            # GPT-2's architecture from a config, random weights (offline), as in the Trainer callback's test.
            config = transformers.GPT2Config(n_layer=N_LAYER, n_head=2, n_embd=32, vocab_size=128, n_positions=SEQ)
            self.model = transformers.GPT2LMHeadModel(config)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            (x,) = batch
            return self.model(input_ids=x, labels=x).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return TinyGPT()


def test_lightning_callback_writes_a_run_folder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, 128, (16 * ACCUM * BATCH, SEQ)))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    from lmprof.integrations import LightningCallback

    cb = LightningCallback(out=tmp_path / "runs", warmup=1, steps=4, profile_steps=2, verbose=False, report=False,
                           watch=True, watch_max_captures=0)
    trainer = pl.Trainer(max_steps=13, accelerator="cpu", devices=1, accumulate_grad_batches=ACCUM, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, callbacks=[cb])
    trainer.fit(TinyGPT(), loader)
    assert cb.folder is not None and cb.folder.parent == tmp_path / "runs"
    run = Run.load(cb.folder)
    assert run.mode == "train" and run.config["source"] == "LightningCallback"
    # The Trainer callback's run folder: both phases, blocks adding up to the clean step, trace and CSVs.
    assert {"forward", "backward", "step"} <= {b.phase for b in run.blocks}
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.metrics["step_time"].value, rel=1e-6)
    # an optimizer step's FLOPs are both micro-batches' (they were one's, MFU half the truth)
    flops = run.metrics["flops.model_per_step"]
    assert flops.value and f"x {ACCUM} micro-batches per optimizer step" in (flops.note or ""), flops
    assert run.metrics["step_time"].n == 4
    for name in ("run.json", "blocks.csv", "ops.csv", "trace.json.gz"):
        assert (cb.folder / name).is_file()
    assert {"attn.qkv", "mlp.fc"} <= {b.name for b in run.blocks if b.phase == "backward"}
    assert {"optimizer", "zero_grad"} <= {b.name for b in run.blocks if b.phase == "step"}
    qkv = next(b for b in run.blocks if b.name == "attn.qkv" and b.phase == "forward")
    assert qkv.calls == N_LAYER * ACCUM
    assert trainer.global_step == 13  # training went on after the run was written
    # watch=True: the steps after the window watched, each with the loss training_step returned and the
    # tokens of its micro-batches (batch x sequence x accumulation)
    from lmprof.record.watch import read_series

    assert run.watch is not None and run.watch.steps >= 2
    series = read_series([cb.folder / p for p in run.watch.series])
    assert len(series["step"]) == run.watch.steps and (series["tokens"] == BATCH * SEQ * ACCUM).all()
    assert ((series["loss"] > 0) & (series["loss"] < 10)).all()  # cross-entropy over 128 tokens: about ln 128


def test_stop_after_stops_the_trainer(tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.randint(0, 128, (40 * BATCH, SEQ)))
    from lmprof.integrations import LightningCallback

    cb = LightningCallback(out=tmp_path / "runs", warmup=1, steps=2, profile_steps=1, stop_after=True,
                           verbose=False, report=False)
    trainer = pl.Trainer(max_steps=40, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, callbacks=[cb])
    trainer.fit(TinyGPT(), torch.utils.data.DataLoader(data, batch_size=BATCH))
    assert cb.folder is not None and (cb.folder / "run.json").is_file()
    assert trainer.global_step < 40
