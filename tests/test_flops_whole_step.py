"""lmprof's whole-step FLOP count (``flop_counter(by_module=False)``): torch's FlopCounterMode without its
module tracker, whose backward hooks fail on some real models (GPT-NeoX-Japanese under ``lmprof infer``).

Truths: torch's own FlopCounterMode with its tracker on a model it handles, and a hand count.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from lmprof.measure.flops import StepFlops, flop_counter


class _ReturnsItsBias(torch.nn.Module):
    """Like GPT-NeoX-Japanese's attention: a module whose output includes one of its own parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 16, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Parameter]:
        return self.proj(x), self.bias


def test_torch_still_keeps_its_tracker_where_the_whole_step_count_replaces_it() -> None:
    # If torch renamed the attribute, by_module=False would silently keep the failing hooks.
    assert hasattr(FlopCounterMode(display=False), "mod_tracker")
    assert type(flop_counter(by_module=False).mod_tracker).__name__ == "_WholeStep"


def test_the_whole_step_count_equals_torchs_own_forward_and_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    x = torch.randn(4, 32)
    with FlopCounterMode(display=False) as torchs:
        model(x).square().mean().backward()
    with flop_counter(by_module=False) as ours:
        model(x).square().mean().backward()
    # forward 2*B*(32*64 + 64*32); backward twice that (input and weight gradients), less the first
    # layer's input gradient, which autograd does not compute for a leaf input without requires_grad
    forward = 2 * 4 * (32 * 64 + 64 * 32)
    assert ours.get_total_flops() == torchs.get_total_flops() == forward + 2 * forward - 2 * 4 * 32 * 64


def test_a_module_returning_its_parameter_under_inference_mode_is_counted() -> None:
    model = _ReturnsItsBias()
    flops = StepFlops()
    with torch.inference_mode():
        flops.start()
        model(torch.randn(3, 8))
        total = flops.stop()
    assert total == 2 * 3 * 8 * 16
