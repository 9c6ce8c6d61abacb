"""A training step that runs another model too: a distillation teacher, a DPO reference model.

Before, such a step's FLOPs were the trained model's alone and nothing said the step ran more: a student
GPT-2 (2 layers, d 64) distilled from a 4-layer d-128 teacher got 89.5 MFLOP a step where the step ran
302 MFLOP, and its HFU was its MFU. Now the figures step sees the other model's outermost calls (torch's
global module hooks, that one warm-up step), the FLOPs step counts the whole step, and the hardware FLOPs
(HFU) are that count, the model FLOPs (MFU) the trained model's. Truth: FlopCounterMode (lmprof's counter)
over one step of identical models, and the student's FLOPs of a run without the teacher.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lmprof
from lmprof.measure.flops import flop_counter
from lmprof.record.catalogue import FLOPS_HARDWARE, FLOPS_MODEL, HFU, MFU
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")
B, T = 2, 16


def _gpt2(layers: int, width: int) -> nn.Module:
    cfg = tf.GPT2Config(n_layer=layers, n_head=2, n_embd=width, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return tf.AutoModelForCausalLM.from_config(cfg)


def _models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return _gpt2(2, 64).train(), _gpt2(4, 128).eval()


def _ids(i: int) -> torch.Tensor:
    return torch.randint(3, 100, (B, T), generator=torch.Generator().manual_seed(i))


Step = Callable[[nn.Module, nn.Module, torch.optim.Optimizer, int], None]


def _distil(student: nn.Module, teacher: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    x = _ids(i)
    with torch.no_grad():
        target = F.softmax(teacher(input_ids=x).logits, -1)
    F.kl_div(F.log_softmax(student(input_ids=x).logits, -1), target, reduction="batchmean").backward()
    opt.step()
    opt.zero_grad()


def _alone(student: nn.Module, teacher: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    x = _ids(i)
    F.cross_entropy(student(input_ids=x).logits.flatten(0, 1), x.flatten()).backward()
    opt.step()
    opt.zero_grad()


def _profiled(tmp_path: Path, step: Step, student: nn.Module, teacher: nn.Module) -> Run:
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    with lmprof.profile(student, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            step(student, teacher, opt, i)
            prof.step()
    return Run.load(prof.folder)


def _counted(step: Step) -> float:
    student, teacher = _models()
    with flop_counter(by_module=False) as fc:
        step(student, teacher, torch.optim.AdamW(student.parameters(), lr=1e-3), 0)
    return float(fc.get_total_flops())


def test_a_distillation_step_counts_the_teacher_in_its_hardware_flops(tmp_path: Path) -> None:
    run = _profiled(tmp_path / "distil", _distil, *_models())
    alone = _profiled(tmp_path / "alone", _alone, *_models())
    hardware = run.metrics[FLOPS_HARDWARE]
    assert hardware.source == "measured"
    assert hardware.value == _counted(_distil)  # the old code: the student's 6N formula, a third of this
    assert run.metrics[FLOPS_MODEL].value == alone.metrics[FLOPS_MODEL].value  # the student's, as without a teacher
    assert run.metrics[HFU].value > 2 * run.metrics[MFU].value
    assert any("another model" in n and "GPT2LMHeadModel" in n for n in run.notes)
    assert not any("another model" in n for n in alone.notes)  # a loss function, a model's own parts: no model


def _log_probs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    lp = F.log_softmax(model(input_ids=x).logits[:, :-1], -1)
    return lp.gather(-1, x[:, 1:, None]).squeeze(-1).sum(-1)


def _dpo(policy: nn.Module, reference: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    """A preference pair: the policy's two forwards in one loss, the frozen reference's two without grad."""
    chosen, rejected = _ids(2 * i), _ids(2 * i + 1)
    with torch.no_grad():
        ref = _log_probs(reference, chosen) - _log_probs(reference, rejected)
    margin = _log_probs(policy, chosen) - _log_probs(policy, rejected) - ref
    (-F.logsigmoid(0.1 * margin).mean()).backward()
    opt.step()
    opt.zero_grad()


def test_a_preference_step_counts_the_reference_model_and_both_forwards(tmp_path: Path) -> None:
    run = _profiled(tmp_path, _dpo, *_models())
    assert run.metrics[FLOPS_HARDWARE].value == _counted(_dpo)
    assert any(n.startswith("2 batches per optimizer step in 1 backward pass") for n in run.notes)  # not accumulation
    assert any("another model" in n and "2 calls a step" in n for n in run.notes)


class _Wrapper(nn.Module):
    """The loop calls a module around the profiled model (the model's parameters are its parameters)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=x).logits


def test_a_wrapper_and_the_model_s_own_embedding_are_no_other_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    student = _gpt2(2, 64).train()
    wrapper, embed = _Wrapper(student), student.get_input_embeddings()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    with lmprof.profile(student, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            x = _ids(i)
            F.cross_entropy(wrapper(embed(x)).flatten(0, 1), x.flatten()).backward()  # embed: called outermost
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run.load(prof.folder)
    assert not any("another model" in n for n in run.notes)
    assert run.metrics[FLOPS_HARDWARE].value == run.metrics[FLOPS_MODEL].value


def test_a_compiled_teacher_is_named_and_not_compiled_again(tmp_path: Path) -> None:
    """The watch hooks the teacher's torch.compile wrapper, outside its compiled code: dynamo compiles it
    once, as without lmprof (torch's global module hooks made it compile twice more, with a warning)."""
    import warnings

    from torch._dynamo.utils import counters

    student, teacher = _models()[0], _gpt2(1, 64).eval()  # one layer: dynamo's tracing is the test's cost
    compiled = torch.compile(teacher, backend="eager")
    frames = counters["frames"]["total"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a warning of torch's would reach the user's stderr
        run = _profiled(tmp_path, _distil, student, compiled)
    assert counters["frames"]["total"] - frames == 1
    assert any("another model" in n and "GPT2LMHeadModel (compiled)" in n for n in run.notes)


def test_modules_that_fail_to_answer_are_passed_over() -> None:
    """Every live module is asked for its children and parameters: one whose answer fails (a half-built
    module, an override that raises) is skipped, not a failure of lmprof's in the user's step."""
    from lmprof.measure.other_models import candidates

    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def parameters(self, recurse: bool = True):  # type: ignore[override]
            raise RuntimeError("no parameters today")

    broken, half, other = Broken(), nn.Linear.__new__(nn.Linear), nn.Linear(3, 3)
    model = nn.Linear(2, 2)
    found = candidates(model)
    assert other in found and broken not in found and model not in found
    del broken, half


def test_a_module_trained_beside_the_model_is_said_to_be_trained(tmp_path: Path) -> None:
    """A head outside the profiled model, trained by the same optimizer: trained with the model, not a teacher; its
    parameters and gradients are in the memory figures (before, the model's alone: the optimizer state had both)."""
    torch.manual_seed(0)
    model, head = _gpt2(2, 64).train(), nn.Linear(128, 4)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            head(model(input_ids=_ids(i)).logits).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run.load(prof.folder)
    (note,) = [n for n in run.notes if n.startswith("the model's own optimizer also trains another module")]
    assert "Linear (516 parameters, 516 of them trained" in note
    assert "not in the model FLOPs and MFU, which lmprof's formulas give for the profiled model alone" in note
    both = 4 * (sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in head.parameters()))  # fp32
    assert run.metrics["memory.params"].value == both and run.metrics["memory.grads"].value == both


def test_an_unfrozen_reference_model_under_no_grad_is_not_said_to_be_trained(tmp_path: Path) -> None:
    """A DPO-style reference model left with requires_grad on (as many loops leave it) and run under no_grad:
    no optimizer steps its parameters, so it is not 'trained beside the model' (it was, by requires_grad)."""
    torch.manual_seed(0)
    policy, ref = _gpt2(2, 64).train(), _gpt2(2, 64).eval()
    assert all(p.requires_grad for p in ref.parameters())
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    with lmprof.profile(policy, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            x = _ids(i)
            with torch.no_grad():
                target = ref(input_ids=x).logits.softmax(-1)
            F.kl_div(policy(input_ids=x).logits.log_softmax(-1), target, reduction="batchmean").backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = Run.load(prof.folder)
    (note,) = [n for n in run.notes if n.startswith("the step also ran another model")]
    assert "trained" not in note and "1 call a step" in note
