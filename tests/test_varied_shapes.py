"""A training loop whose steps run different shapes (batches padded to their longest sequence).

Before, one step's shape (the figures step's) gave every step's FLOPs: a loop cycling sequence lengths
16..128 got the FLOPs of a 4 x 16 step over the median time of all of them, an MFU of no step.
Truth: torch's FlopCounterMode over a step of an identical model at each length, and the lengths the
loop itself fed (the protocol's clean steps are loop iterations 4..13 with the default counts).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import lmprof
from lmprof.measure.flops import flop_counter
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")
B = 4
LENGTHS = [16, 32, 64, 128, 48, 96, 16, 128, 32, 64, 80, 112, 16, 64, 32, 128, 48, 96, 16, 64]
CLEAN = range(3, 13)  # loop iterations (0-based) of the clean window: warm-up 3, clean 10


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=128, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    # eager attention: FlopCounterMode counts its matmuls as the formulas do (a fused kernel's backward
    # recomputes the scores, which FlopCounterMode counts and model FLOPs do not)
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").train()


def _ids(i: int) -> torch.Tensor:
    return torch.randint(3, 100, (B, LENGTHS[i]), generator=torch.Generator().manual_seed(i))


def _loop(model: nn.Module, out: Path, loss_of) -> Run:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with lmprof.profile(model, out=out, report=False, verbose=False) as prof:
        for i in range(len(LENGTHS)):
            loss_of(model, _ids(i)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return Run.load(prof.folder)


def _hf_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=x).loss


def test_each_step_counts_its_own_shape(tmp_path: Path) -> None:
    run = _loop(_gpt2(), tmp_path / "runs", _hf_loss)
    counted = {}
    for t in set(LENGTHS[i] for i in CLEAN):
        with flop_counter(by_module=False) as fc:
            _hf_loss(_gpt2(), torch.randint(3, 100, (B, t))).backward()
        counted[t] = fc.get_total_flops()
    truth = sum(counted[LENGTHS[i]] for i in CLEAN) / len(CLEAN)
    flops = run.metrics["flops.model_per_step"]
    # the formulas count bias and norm parameters too (6N), FlopCounterMode matmuls only: at d=64 that is
    # +1.3% (T=128) to +1.6% (T=16) at every length alone; one shape's FLOPs for all steps was -15%
    assert flops.value == pytest.approx(truth, rel=0.02), flops.note
    assert run.value("tokens_per_step") == sum(B * LENGTHS[i] for i in CLEAN) / len(CLEAN)
    assert any(n.startswith("the clean steps ran different shapes") for n in run.notes)
    # MFU is the steps' FLOPs over their time: achieved FLOP/s x steps = FLOPs x steps / time
    assert run.value("mfu") == pytest.approx(100 * run.value("flops.achieved") / run.value("peak.flops"), rel=1e-9)
    blocks = [b for b in run.blocks if b.phase in ("forward", "backward") and b.flops]
    assert blocks  # the profiled steps' mean shapes


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(100, 32), nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def test_a_model_without_formulas_gets_no_flops_of_one_shape(tmp_path: Path) -> None:
    """Counted on one step, FLOPs are that step's shape only: MFU is n/a with the reason, not a guess."""
    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())

    torch.manual_seed(0)
    run = _loop(Net(), tmp_path / "runs", loss)
    for key in ("mfu", "flops.model_per_step"):
        m = run.metrics[key]
        assert m.value is None and "different shapes" in (m.note or ""), key
    assert run.value("step_time")  # the timing stands
