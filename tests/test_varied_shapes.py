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
LENGTHS = [16, 32, 64, 128, 32, 64, 16, 128, 32, 64, 16, 128, 16, 64, 32, 128, 32, 64, 16, 64]
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


def _clean_truth(make) -> float:
    """The truth: the clean steps' mean of FlopCounterMode's count of a step at each one's length."""
    counted = {}
    for t in set(LENGTHS[i] for i in CLEAN):
        with flop_counter(by_module=False) as fc:
            _hf_loss(make(), torch.randint(3, 100, (B, t))).backward()
        counted[t] = fc.get_total_flops()
    return sum(counted[LENGTHS[i]] for i in CLEAN) / len(CLEAN)


def test_each_step_counts_its_own_shape(tmp_path: Path) -> None:
    run = _loop(_gpt2(), tmp_path / "runs", _hf_loss)
    truth = _clean_truth(_gpt2)
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


PROMPTS = [16, 128, 32, 96, 64, 16, 128, 48, 112, 24]
GENERATE = """
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=256, bos_token_id=0, eos_token_id=0,
                 pad_token_id=0)
model = GPT2LMHeadModel(cfg).eval()
for t in %r:
    ids = torch.randint(3, 100, (2, t), generator=torch.Generator().manual_seed(t))
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                   pad_token_id=0)
""" % (PROMPTS,)


def test_each_generation_counts_its_own_prompt(tmp_path: Path) -> None:
    """Prompts of different lengths: each clean generation's prefill and decode FLOPs are its own (generations
    2-6 with the default counts), against FlopCounterMode over generate() at each length."""
    from tests.test_usercode import lmprof_run, write

    script = write(tmp_path, "gen.py", GENERATE)
    code, folder = lmprof_run(tmp_path, "--infer", "--profile-steps", 1, script)
    assert code == 0 and folder is not None
    run = Run.load(folder)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=256,
                                             bos_token_id=0, eos_token_id=0, pad_token_id=0)).eval()

    def count(t: int, new: int) -> float:
        ids = torch.randint(3, 100, (2, t))
        with flop_counter(by_module=False) as fc:
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
        return fc.get_total_flops()

    clean = PROMPTS[1:6]
    prefill = [count(t, 1) for t in clean]  # generate() of one token: its prefill alone
    decode = [count(t, 8) - p for t, p in zip(clean, prefill)]
    # within the formulas' bias and norm parameters (6N / 2N), as at a single length
    assert run.value("prefill.flops.model_per_step") == pytest.approx(sum(prefill) / 5, rel=0.02)
    assert run.value("decode.flops.model_per_step") == pytest.approx(sum(decode) / 5, rel=0.02)
    assert any(n.startswith("the clean generations ran different shapes") for n in run.notes)


def test_a_model_read_off_the_meta_device_is_read_at_each_shape(tmp_path: Path) -> None:
    """OLMo has no lmprof formulas: the describer reads it at each shape the steps ran, and each clean step's
    FLOPs are its own, equal to FlopCounterMode's at that length (the describer is exact on OLMo)."""
    from lmprof.measure.model_facts.tiny import tiny_config

    def olmo() -> nn.Module:
        torch.manual_seed(0)
        return tf.AutoModelForCausalLM.from_config(tiny_config("olmo")).train()

    run = _loop(olmo(), tmp_path / "runs", _hf_loss)
    flops = run.metrics["flops.model_per_step"]
    assert flops.value == pytest.approx(_clean_truth(olmo), rel=1e-9), flops.note
    assert "read off the model on the meta device" in (flops.note or "") and run.value("mfu")


def test_the_watch_series_has_each_steps_own_tokens(tmp_path: Path) -> None:
    """The whole-run watch's tokens column: each watched step's own batch x sequence (it was the run's one
    figure for every step), as the loop fed it."""
    from lmprof.record.watch import read_series

    model = _gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    lengths = [LENGTHS[i % len(LENGTHS)] for i in range(50)]
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False, watch=True,
                        watch_max_captures=0) as prof:
        for t in lengths:
            x = torch.randint(3, 100, (B, t))
            _hf_loss(model, x).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run.load(prof.folder)
    s = read_series([prof.folder / p for p in run.watch.series])
    assert len(s["step"]) > 20
    assert [int(v) for v in s["tokens"]] == [B * lengths[int(k) - 1] for k in s["step"]]
