"""The user's own code gets the figures ``lmprof train`` / ``infer`` get: FLOPs, MFU, memory, KV cache.

Independent truths: torch's FlopCounterMode on the same step (run here, outside lmprof), the exact
bytes of the live parameters and optimizer state, the KV-cache formula 2 x layers x kv_heads x
head_dim x tokens x bytes, and a ``lmprof train --hf-config`` run of the same config and batch.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmprof
from lmprof.cli.main import main
from lmprof.record.run import Run

transformers = pytest.importorskip("transformers")

B, T = 2, 16


def _gpt2_config() -> object:
    return transformers.GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=256, n_positions=64,
                                   bos_token_id=0, eos_token_id=0)


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(_gpt2_config())


def _train_loop(model: torch.nn.Module, prof: object, steps: int) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, 256, (B, T))
    for _ in range(steps):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()  # type: ignore[attr-defined]
    return opt


def _counted_train_flops(model: torch.nn.Module) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randint(0, 256, (B, T))
    with FlopCounterMode(display=False) as fc:
        model(input_ids=x, labels=x).loss.backward()
    model.zero_grad(set_to_none=True)
    return int(fc.get_total_flops())


def test_hf_training_loop_gets_flops_mfu_and_memory_like_lmprof_train(tmp_path: Path) -> None:
    model = _gpt2()
    with lmprof.profile(model, out=tmp_path / "uc", warmup=2, steps=3, profile_steps=1, report=False,
                        verbose=False) as prof:
        opt = _train_loop(model, prof, 8)
    assert prof.folder is not None
    run = Run.load(prof.folder)
    truth = _counted_train_flops(_gpt2())
    flops = run.value("flops.model_per_step")
    assert flops is not None and abs(flops - truth) / truth < 0.01, (flops, truth)
    assert run.value("mfu") is not None or run.metrics["mfu"].note  # a value, or n/a with its reason
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert run.value("memory.params") == params
    assert run.value("memory.grads") == params  # every parameter has an fp32 gradient
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
    assert run.value("memory.optimizer") == state  # exp_avg, exp_avg_sq and the step counters
    assert run.value("memory.peak") and run.value("memory.estimated.peak")

    # The same config and batch through lmprof train: the same FLOPs and memory categories, peak within 5%.
    cfg = tmp_path / "gpt2-tiny"
    _gpt2_config().save_pretrained(cfg)  # type: ignore[attr-defined]
    assert main(["train", "--hf-config", str(cfg / "config.json"), "-b", str(B), "--seq-len", str(T), "--steps", "3",
                 "--warmup", "1", "--profile-steps", "1", "--no-report", "--energy", "off", "--out",
                 str(tmp_path / "tr")]) == 0
    (folder,) = (tmp_path / "tr").iterdir()
    built = Run.load(folder)
    assert built.value("flops.model_per_step") == pytest.approx(flops, rel=1e-9)
    for key in ("memory.params", "memory.grads", "memory.optimizer"):
        assert built.value(key) == run.value(key), key
    peak, built_peak = run.value("memory.peak"), built.value("memory.peak")
    assert peak and built_peak and abs(peak - built_peak) / built_peak < 0.05, (peak, built_peak)


class Net(torch.nn.Module):
    """A model lmprof has no formulas for."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _profiled_sgd(model: torch.nn.Module, x: torch.Tensor, tmp_path: Path) -> Run:
    """Five SGD steps of ``model`` on ``x`` under lmprof.profile (warm-up 1: FLOPs counted in the figures step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with lmprof.profile(model, out=tmp_path, warmup=1, steps=2, profile_steps=1, report=False, verbose=False) as prof:
        for _ in range(5):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return Run.load(prof.folder)  # type: ignore[arg-type]


def test_undescribed_model_gets_flops_counted_and_says_so(tmp_path: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    x = torch.randn(8, 32)
    run = _profiled_sgd(Net(), x, tmp_path)
    with FlopCounterMode(display=False) as fc:
        Net()(x).pow(2).mean().backward()
    assert run.value("flops.model_per_step") == fc.get_total_flops()
    assert run.metrics["flops.model_per_step"].source == "measured"
    assert "FlopCounterMode" in (run.metrics["flops.model_per_step"].note or "")
    assert any("FlopCounterMode" in n for n in run.notes)
    assert run.value("mbu") is None and run.metrics["mbu"].note  # no byte model: n/a with the reason


class SdpaNet(torch.nn.Module):
    """Attention through ``F.scaled_dot_product_attention``, as nanoGPT writes it: on a CPU torch runs
    it as an op FlopCounterMode has no formula for."""

    H, D = 4, 8

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p.view(b, t, self.H, self.D).transpose(1, 2) for p in self.qkv(x).split(32, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, 32))


def test_undescribed_model_with_sdpa_counts_its_attention(tmp_path: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    run = _profiled_sgd(SdpaNet(), x, tmp_path)
    with FlopCounterMode(display=False) as fc:  # torch alone: the linears' matmuls, attention as 0
        SdpaNet()(x).pow(2).mean().backward()
    # By hand: QK^T and PV forward (2 matmuls of 2*B*H*T*T*D), and torch's flash-backward count (5).
    one = 2 * 2 * SdpaNet.H * 16 * 16 * SdpaNet.D
    assert run.value("flops.model_per_step") == fc.get_total_flops() + 2 * one + 5 * one


def test_generate_gets_prefill_decode_flops_kv_cache_and_mbu(tmp_path: Path) -> None:
    from lmprof.measure.flops import count_causal_lm_flops, flop_counter

    model = _gpt2().eval()
    x = torch.randint(0, 256, (B, T))
    new = 6
    with lmprof.profile(model, out=tmp_path, infer=True, warmup=1, steps=2, profile_steps=1, report=False,
                        verbose=False) as prof:
        for _ in range(5):
            model.generate(x, max_new_tokens=new, do_sample=False, pad_token_id=0)
            prof.step()
    run = Run.load(prof.folder)  # type: ignore[arg-type]
    # The truth is the prefill generate() ran: its first forward, which asks GPT-2 for the last
    # position's logits only (logits_to_keep=1), counted by FlopCounterMode (a hook marks the forwards).
    # A plain model(x) computes every position's: 7.6% more here, what the run said before it read
    # the prefill's logits off its output.
    truth_model, marks = _gpt2().eval(), []
    truth_model.register_forward_pre_hook(lambda mod, a, k: marks.append(fc.get_total_flops()), with_kwargs=True)
    with torch.no_grad(), flop_counter(by_module=False) as fc:
        truth_model.generate(x, max_new_tokens=new, do_sample=False, pad_token_id=0)
    truth_prefill = marks[1] - marks[0]
    assert truth_prefill < count_causal_lm_flops(_gpt2(), x).prefill
    prefill = run.value("prefill.flops.model_per_step")
    assert prefill is not None and abs(prefill - truth_prefill) / truth_prefill < 0.01, (prefill, truth_prefill)
    assert run.value("decode.flops.model_per_step")
    cfg = model.config
    # 6N counts bias and norm parameters as FLOPs, FlopCounterMode counts matmuls only: at n_embd 128 they
    # differ by under 1%, the bound (at n_embd 64 by 1.5%).
    kv = 2 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * (T + new - 1) * B * 4
    assert run.value("kv_cache") == kv and run.value("kv_cache.estimated") == kv
    assert "decode.mbu" in run.metrics
