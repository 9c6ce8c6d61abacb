"""A fine-tuning loop's FLOPs: frozen weights and added adapters, read off the model as it runs.

lmprof's formulas (and a model read off the meta device) describe the model a config builds, every weight
trained. Before, a loop that froze weights or added LoRA adapters got those figures with exit 0: a small
GPT-2 training its last two layers was given 1.51x the FLOPs its step ran, hand-written LoRA adapters
1.46x, OLMo under PEFT's LoRA 1.36x, and MFU as much too high. Truth: torch's FlopCounterMode (lmprof's
counter, which adds CPU SDPA) over one step of an identical model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import lmprof
from lmprof.measure.flops import flop_counter
from lmprof.record.catalogue import FLOPS_MODEL, MFU
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")
B, T = 2, 16


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return tf.AutoModelForCausalLM.from_config(cfg).train()


def _olmo() -> nn.Module:  # a family without formulas: read off the meta device when unchanged
    from lmprof.measure.model_facts.tiny import tiny_config

    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(tiny_config("olmo")).train()


def _last_layer_only(model: nn.Module) -> nn.Module:
    model.requires_grad_(False)
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    layers[-1].requires_grad_(True)
    return model


class _LoRA(nn.Module):
    """A low-rank adapter beside a frozen GPT-2 projection (transformers' Conv1D: weight is in x out)."""

    def __init__(self, base: nn.Module, r: int = 4):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape
        self.a = nn.Parameter(torch.randn(n_in, r) * 0.01)
        self.b = nn.Parameter(torch.zeros(r, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a) @ self.b


def _with_lora(model: nn.Module) -> nn.Module:
    model.requires_grad_(False)
    for block in model.transformer.h:
        block.attn.c_attn = _LoRA(block.attn.c_attn)
    return model


def _step(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    x = torch.randint(3, 100, (B, T), generator=torch.Generator().manual_seed(i))
    labels = x[:, 0] % 3 if isinstance(model, tf.GPT2ForSequenceClassification) else x
    model(input_ids=x, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad()


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def _profiled(tmp_path: Path, model: nn.Module) -> Run:
    opt = _optimizer(model)
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            _step(model, opt, i)
            prof.step()
    return Run.load(prof.folder)


def _counted(make: Callable[[], nn.Module]) -> float:
    model = make()
    with flop_counter(by_module=False) as fc:
        _step(model, _optimizer(model), 0)
    return float(fc.get_total_flops())


def _classifier() -> nn.Module:  # another head on the same body: the config's LM head is not there
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, num_labels=3, pad_token_id=0)
    return tf.GPT2ForSequenceClassification(cfg).train()


CASES = {
    "gpt2, last layer trained": (lambda: _last_layer_only(_gpt2()), "freezes"),
    "gpt2, LoRA adapters": (lambda: _with_lora(_gpt2()), "parameters where the causal LM its config describes"),
    "olmo, last layer trained": (lambda: _last_layer_only(_olmo()), "freezes"),
    "gpt2, a classification head": (_classifier, "parameters where the causal LM its config describes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fine_tuning_step_has_the_flops_it_ran(tmp_path: Path, case: str) -> None:
    make, said = CASES[case]
    run = _profiled(tmp_path, make())
    flops = run.metrics[FLOPS_MODEL]
    assert flops.source == "measured"
    assert flops.value == _counted(make)  # the old code: the config's model, 1.3-1.5x this
    assert run.metrics[MFU].value is not None
    assert any(said in n and "counted on a real step" in n for n in run.notes)


def test_the_config_s_own_model_does_not_depart(tmp_path: Path) -> None:
    """No false alarm: the model as built keeps lmprof's formulas, and a family's own frozen weights
    (sinusoidal position tables, here Marian's) are not the loop's doing."""
    run = _profiled(tmp_path, _gpt2())
    assert run.metrics[FLOPS_MODEL].source == "estimated"
    assert not any("departs" in n or "freezes" in n for n in run.notes)
    from lmprof.measure.model_facts.departure import departure
    from lmprof.measure.model_facts.meta import build_on_meta
    from lmprof.measure.model_facts.tiny import tiny_config

    marian = build_on_meta(tiny_config("marian"))
    assert any(not p.requires_grad for p in marian.parameters())
    assert departure(marian, None, trains=True) is None
    marian.requires_grad_(False)  # inference: frozen weights change nothing
    assert departure(marian, None, trains=False) is None
    assert "freezes" in (departure(marian, None, trains=True) or "")
