"""Gradient accumulation in a user's loop: the FLOPs, bytes and MFU of an optimizer step are those of all its
micro-batches.

Before, a step of K micro-batches was counted as one (the model's formulas, or the describer, at the
first forward's batch): its FLOPs K times too few and MFU K times too low, with the accumulation note
right beside them (found with an Accelerate loop, ``gradient_accumulation_steps=2``: MFU 2.7% against
4.8% without accumulation). Truth: torch's FlopCounterMode over one whole optimizer step of an
identical model, the K forwards and backwards.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import lmprof
from lmprof.measure.flops import flop_counter
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")
K, B, T = 3, 2, 16


def _model(family: str) -> nn.Module:
    torch.manual_seed(0)
    if family == "gpt2":  # lmprof's formulas
        cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    else:  # read off the model on the meta device
        from lmprof.measure.model_facts.tiny import tiny_config

        cfg = tiny_config(family)
    return tf.AutoModelForCausalLM.from_config(cfg).train()


def _micro_batches(i: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return [torch.randint(3, 100, (B, T), generator=g) for _ in range(K)]


Step = Callable[[nn.Module, torch.optim.Optimizer, int], None]  # the loop's step i, on the model it calls


def _step(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    for x in _micro_batches(i):
        (model(input_ids=x, labels=x).loss / K).backward()
    opt.step()
    opt.zero_grad()


def _profiled(tmp_path: Path, called: nn.Module, params: nn.Module, step: Step, steps: int = 17) -> Run:
    """The loop under ``lmprof.profile``: ``step`` on ``called`` (the model, or its compiled wrapper)."""
    opt = torch.optim.AdamW(params.parameters(), lr=1e-3)
    with lmprof.profile(called, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(steps):
            step(called, opt, i)
            prof.step()
    return Run.load(prof.folder)


def _counted(make: Callable[[], nn.Module], step: Step) -> float:
    """The truth: FlopCounterMode over one step of a fresh, identical model, run eagerly."""
    model = make()
    with flop_counter(by_module=False) as fc:
        step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), 0)
    return float(fc.get_total_flops())


@pytest.mark.parametrize("family", ["gpt2", "olmo"])
def test_an_optimizer_step_counts_all_its_micro_batches(tmp_path: Path, family: str) -> None:
    model = _model(family)
    run = _profiled(tmp_path, model, model, _step)
    assert any(n.startswith(f"gradient accumulation: {K} batches") for n in run.notes)
    assert run.value("tokens_per_step") == K * B * T
    flops = run.metrics["flops.model_per_step"]
    # lmprof's formula counts bias and norm parameters (6N), FlopCounterMode matmuls only: within 1%
    assert flops.value == pytest.approx(_counted(lambda: _model(family), _step), rel=0.01), flops.note
    assert "3 micro-batches per optimizer step" in (flops.note or "")
    step_s, peak = run.value("step_time") / 1e3, run.value("peak.flops")
    assert run.value("mfu") == pytest.approx(100 * flops.value / step_s / peak, rel=1e-9)
    blocks = sum(b.flops or 0 for b in run.blocks if b.phase in ("forward", "backward"))
    assert blocks == pytest.approx(flops.value, rel=0.05)  # the blocks are the step's too


def _one_batch(m: nn.Module, o: torch.optim.Optimizer, i: int) -> None:
    x = _micro_batches(i)[0]
    m(input_ids=x, labels=x).loss.backward()
    o.step()
    o.zero_grad()


def test_an_evaluation_inside_the_loop_is_no_micro_batch(tmp_path: Path) -> None:
    """A no_grad evaluation forward every few steps (another shape) was counted as a second batch: "gradient
    accumulation: 1.33 batches per optimizer step", tokens 299 per step, and with accumulation read from
    that, FLOPs 1.33x. Truth: the loop's own training batch (B x T) and FlopCounterMode over its step."""
    def with_evaluation(m: nn.Module, o: torch.optim.Optimizer, i: int) -> None:
        _one_batch(m, o, i)
        if i % 3 == 0:
            with torch.no_grad():
                m(input_ids=torch.randint(3, 100, (2 * B, 2 * T)))

    model = _model("gpt2")
    run = _profiled(tmp_path, model, model, with_evaluation, steps=20)
    assert not any(n.startswith("gradient accumulation") for n in run.notes), run.notes
    assert run.value("tokens_per_step") == B * T
    assert run.value("flops.model_per_step") == pytest.approx(_counted(lambda: _model("gpt2"), _one_batch), rel=0.02)
    # the evaluation is in the time of the steps it ran in (loop step i is the protocol's step i + 1), and said
    w, n = run.config["warmup"], run.config["steps"]
    evaluated = sum(1 for k in range(w + 1, w + n + 1) if (k - 1) % 3 == 0)
    assert any(note.startswith(f"{evaluated} of the {n} clean steps also ran the model without grad")
               for note in run.notes), run.notes


def test_a_model_fed_embeddings_has_its_tokens_and_flops(tmp_path: Path) -> None:
    """``model(inputs_embeds=...)`` (a multimodal or prompt-tuning loop): no token ids, so no shape was seen and
    the run said "lmprof has no formulas for this model" of GPT-2. The embeddings' (batch, sequence) are the
    step's tokens. Truth: the loop's B x T and FlopCounterMode over the same step."""
    def embedded(m: nn.Module, o: torch.optim.Optimizer, i: int) -> None:
        x = _micro_batches(i)[0]
        m(inputs_embeds=m.get_input_embeddings()(x), labels=x).loss.backward()
        o.step()
        o.zero_grad()

    model = _model("gpt2")
    run = _profiled(tmp_path, model, model, embedded)
    assert run.value("tokens_per_step") == B * T and (run.config["batch_size"], run.config["seq_len"]) == (B, T)
    assert run.value("flops.model_per_step") == pytest.approx(_counted(lambda: _model("gpt2"), embedded), rel=0.02)


def test_a_compiled_model_has_its_tokens_and_flops(tmp_path: Path) -> None:
    """``torch.compile(model)`` under ``lmprof.profile``: no hook goes inside compiled code, so no shape was
    seen: no FLOPs at all, "lmprof has no formulas for this model" of GPT-2, and two micro-batches read as
    "2 backward passes per batch". The wrapper's own hook (outside the compiled code) sees each call.
    Truth: the loop's batches and FlopCounterMode over an eager step; and no recompilation."""
    def one_layer() -> nn.Module:  # dynamo traces every layer: one keeps the test short
        torch.manual_seed(0)
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=64,
                                                bos_token_id=0, eos_token_id=0)).train()

    def two_batches(m: nn.Module, o: torch.optim.Optimizer, i: int) -> None:
        for x in _micro_batches(i)[:2]:
            m(input_ids=x, labels=x).loss.backward()
        o.step()
        o.zero_grad()

    model = one_layer()
    # dynamo with no inductor: whether a hook recompiles is dynamo's question, answered cheaply
    run = _profiled(tmp_path, torch.compile(model, backend="eager"), model, two_batches)
    assert run.value("tokens_per_step") == 2 * B * T
    assert any(n.startswith("gradient accumulation: 2 batches") for n in run.notes), run.notes
    # the formulas' 6N counts bias and norm parameters, FlopCounterMode matmuls only (d=32: +2.76%, measured)
    assert run.value("flops.model_per_step") == pytest.approx(_counted(one_layer, two_batches), rel=0.04)
    assert run.value("compile.recompiles") == 0
