"""Two modules the loop calls apart and one optimizer trains (an encoder and a decoder): one training.

Before, the module holding most of the optimizer's parameters was the model and the other "another model ...
(a teacher, a reference or a reward model)": memory.params and memory.grads were the encoder's alone while
memory.optimizer held both, and MFU was refused ("the step ran other models' forwards too"). Truth: the
parameter counts of the script's own modules, and the step's FLOPs by hand (matmuls, 2 FLOPs a multiply-add).
"""
from __future__ import annotations


import pytest

LOOP = """
import torch
torch.manual_seed(0)
enc = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
dec = torch.nn.Sequential(torch.nn.Linear(64, 384), torch.nn.GELU(), torch.nn.Linear(384, 128))
opt = torch.optim.AdamW(list(enc.parameters()) + list(dec.parameters()), lr=1e-3)
for i in range(20):
    x = torch.randn(64, 128)
    torch.nn.functional.mse_loss(dec(enc(x)), x).backward()
    opt.step()
    opt.zero_grad()
"""


def test_an_encoder_and_decoder_trained_by_one_optimizer_are_one_training(run_script) -> None:
    done = run_script(LOOP)
    assert done.code == 0, done.err
    record = done.record
    m = {k: v["value"] for k, v in record["metrics"].items()}
    enc = 128 * 512 + 512 + 512 * 64 + 64
    dec = 64 * 384 + 384 + 384 * 128 + 128
    assert m["memory.params"] == m["memory.grads"] == 4 * (enc + dec)
    assert m["memory.optimizer"] == 2 * 4 * (enc + dec) + 8 * 4  # AdamW's two moments; a 4-byte step count a tensor
    # forward 2 x 64 x (all weights' multiply-adds); backward twice that, less the first layer's input gradient
    macs = 128 * 512 + 512 * 64 + 64 * 384 + 384 * 128
    assert m["flops.model_per_step"] == 3 * 2 * 64 * macs - 2 * 64 * 128 * 512
    assert m["mfu"] == pytest.approx(m["hfu"]) and m["mfu"] > 0
    (note,) = [n for n in record["notes"] if n.startswith("the model's own optimizer also trains another module")]
    assert "Sequential (74,240 parameters" in note and "in the model FLOPs and MFU with the model's" in note
    assert not any("a teacher, a reference or a reward model" in n for n in record["notes"])


def test_an_fp32_master_copy_is_not_a_parameter() -> None:
    """An optimizer stepping fp32 copies of a bf16 model's weights (apex O2's master weights) and a bf16 head kept
    outside the model: the head's parameters are trained ones, the copies are not parameters."""
    import torch

    from lmprof.measure.tensor_bytes import static_memory

    model = torch.nn.Linear(16, 16).to(torch.bfloat16)
    head = torch.nn.Linear(16, 2).to(torch.bfloat16)
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD([*masters, *head.parameters()], lr=0.1)
    got = static_memory(model, [opt])
    assert got.n_params == (16 * 16 + 16) + (16 * 2 + 2) and got.params == 2 * got.n_params
