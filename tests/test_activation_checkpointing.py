"""A user's training loop with activation checkpointing, under ``lmprof.profile()``.

Two breaks found by running a Hugging Face model with ``gradient_checkpointing_enable()`` through the
user-code door: the loop itself failed (lmprof's look at the tensors autograd saved unpacked the
checkpoint's, which may be unpacked once: "Unpack is being triggered for a tensor that was already
unpacked once"), and the hardware FLOPs said "no recomputation" although the backward re-runs parts
of the forward.

Truths: the same loop's losses without lmprof; torch's FlopCounterMode over one training step of an
identical model, checkpointed (what ran: the hardware FLOPs) and not (the model FLOPs).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import lmprof
from lmprof.measure.flops import flop_counter
from lmprof.record.run import Run

STEPS = 20


def _count(model: nn.Module, step) -> int:
    with flop_counter(by_module=False) as fc:
        step(model)
    return int(fc.get_total_flops())


def _loop(model: nn.Module, step, out: Path | None) -> tuple[list[float], Run | None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []

    def one() -> None:
        losses.append(step(model))
        opt.step()
        opt.zero_grad()

    if out is None:
        for _ in range(STEPS):
            one()
        return losses, None
    with lmprof.profile(model, out=out, report=False, verbose=False) as prof:
        for _ in range(STEPS):
            one()
            prof.step()
    return losses, Run.load(prof.folder)


def test_hugging_face_gradient_checkpointing_runs_and_counts_the_recomputation(tmp_path: Path) -> None:
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    x = torch.randint(0, 256, (4, 32))

    def model(checkpointed: bool) -> nn.Module:
        torch.manual_seed(0)
        m = tf.GPT2LMHeadModel(cfg).train()
        if checkpointed:
            m.gradient_checkpointing_enable()
        return m

    def step(m: nn.Module) -> float:
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        return float(loss.item())

    alone, _ = _loop(model(True), step, None)
    seen, run = _loop(model(True), step, tmp_path / "runs")
    assert seen == alone  # the user's loop, unchanged (before: CheckpointError at the figures step)
    assert run is not None
    hardware, flops = run.metrics["flops.hardware_per_step"], run.metrics["flops.model_per_step"]
    assert hardware.value == _count(model(True), step) and hardware.source == "measured"
    assert "checkpointed" in (hardware.note or "")
    # the model FLOPs stay the formula's: within 1% of a step without checkpointing, counted
    assert flops.value == pytest.approx(_count(model(False), step), rel=0.01)
    assert hardware.value > 1.1 * flops.value
    mfu, hfu = run.value("mfu"), run.value("hfu")
    assert mfu and hfu and hfu / mfu == pytest.approx(hardware.value / flops.value, rel=1e-9)


class Net(nn.Module):
    """No lmprof formulas (not a transformer it knows): its FLOPs are counted on a warm-up step."""

    def __init__(self, reentrant: bool | None, offload: bool = False) -> None:
        super().__init__()
        self.reentrant, self.offload = reentrant, offload
        self.emb, self.head = nn.Embedding(100, 64), nn.Linear(64, 100)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                                    for _ in range(2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for layer in self.layers:
            if self.reentrant is None:
                h = h + layer(h)
            else:
                h = h + checkpoint(layer, h, use_reentrant=self.reentrant)
        return self.head(h)


def _net_step(m: nn.Module) -> float:
    ids = torch.arange(64).remainder(100).view(4, 16)
    if m.offload:  # saved tensors packed by a hook that is no recomputation (CPU offloading)
        with torch.autograd.graph.save_on_cpu():
            loss = nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    else:
        loss = nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return float(loss.item())


def _net(reentrant: bool | None, offload: bool = False) -> Net:
    torch.manual_seed(0)
    return Net(reentrant, offload)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_module_without_formulas_has_hardware_flops_and_no_model_flops(tmp_path, reentrant):
    """Counted FLOPs of a step that recomputes are what ran: hardware FLOPs and HFU stand, the model FLOPs
    and MFU are n/a with the reason (lmprof has no formulas to take the recomputation out)."""
    alone, _ = _loop(_net(reentrant), _net_step, None)
    seen, run = _loop(_net(reentrant), _net_step, tmp_path / "runs")
    assert seen == alone and run is not None
    hardware = run.metrics["flops.hardware_per_step"]
    assert hardware.value == _count(_net(reentrant), _net_step) > _count(_net(None), _net_step)
    assert run.metrics["hfu"].value
    for key in ("flops.model_per_step", "mfu"):
        assert run.metrics[key].value is None and "checkpointed" in (run.metrics[key].note or ""), key


def test_saved_tensors_offloaded_to_the_cpu_are_no_recomputation(tmp_path):
    """A saved-tensor hook that is not a checkpoint (save_on_cpu) is read as no recomputation: the count
    is the model FLOPs, MFU == HFU, and the loop runs as alone."""
    alone, _ = _loop(_net(None, offload=True), _net_step, None)
    seen, run = _loop(_net(None, offload=True), _net_step, tmp_path / "runs")
    assert seen == alone and run is not None
    assert run.value("flops.model_per_step") == run.value("flops.hardware_per_step") == _count(_net(None), _net_step)
    assert run.value("mfu") == run.value("hfu")


def test_trainer_with_gradient_checkpointing_trains_to_the_end_under_the_callback(tmp_path: Path) -> None:
    """TrainingArguments(gradient_checkpointing=True) with lmprof's Trainer callback: the training failed at
    the figures step before; now it ends with the loss it has without the callback, and HFU above MFU."""
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 256, (48, 32), generator=torch.Generator().manual_seed(0))]

    def train(callbacks: list) -> float:
        torch.manual_seed(0)
        args = tf.TrainingArguments(output_dir=str(tmp_path / "t"), max_steps=12, per_device_train_batch_size=4,
                                    gradient_checkpointing=True, report_to=[], logging_steps=100,
                                    save_strategy="no", use_cpu=True, disable_tqdm=True)
        out = tf.Trainer(model=tf.GPT2LMHeadModel(cfg), args=args, train_dataset=data, callbacks=callbacks).train()
        return float(out.training_loss)

    alone = train([])
    assert train([lmprof.integrations.TrainerCallback(out=tmp_path / "runs", verbose=False)]) == alone
    (folder,) = [p.parent for p in (tmp_path / "runs").glob("*/run.json")]
    run = Run.load(folder)
    assert run.value("flops.hardware_per_step") > run.value("flops.model_per_step") > 0
    assert run.value("hfu") > run.value("mfu") > 0
