"""The memory estimate follows the attention kernel that runs and counts every dropout mask.

Truths: the kernel autograd recorded (the grad_fn of F.scaled_dot_product_attention's output) for
the SDPA rule, and measured CPU training steps (the allocator's own events) for the estimate, with
Hugging Face GPT-2's dropout as transformers configures it (0.1 on embeddings, probabilities and
both branches: SDPA runs its math kernel on the CPU in train mode).
"""
from __future__ import annotations

import pytest

from lmprof.estimate.memory import estimate_memory, largest_fitting_batch
from lmprof.estimate.dropout import Dropout, dropout_at, dropout_from_config
from lmprof.estimate.sdpa_path import sdpa_path

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_sdpa_path_is_the_kernel_torch_runs_on_the_cpu(dtype: str, p: float) -> None:
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=tdtype, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    ran = "fused" if "FlashAttentionForCpu" in type(out.grad_fn).__name__ else "math"
    assert sdpa_path("cpu", dtype, p) == ran
    assert sdpa_path("cpu", dtype, p, training=False) == "fused"  # eval mode passes dropout_p=0


def test_dropout_as_transformers_configures_it() -> None:
    # GPT-2's three rates default to 0.1 in GPT2Config, OPT's dropout too; the table's configs omit them.
    assert dropout_from_config({"model_type": "gpt2"}) == Dropout(0.1, 0.1, 0.1)
    assert dropout_from_config({"model_type": "opt"}) == Dropout(residual=0.1)
    assert dropout_from_config({"model_type": "gpt2", "attn_pdrop": 0.0}).attention == 0.0
    assert dropout_from_config({"model_type": "llama", "attention_dropout": 0.2}) == Dropout(attention=0.2)
    # Falcon with rotary positions never drops the probabilities (it passes dropout_p=0 to SDPA).
    assert dropout_from_config({"model_type": "falcon", "attention_dropout": 0.1, "hidden_dropout": 0.1}) \
        == Dropout(residual=0.1)
    assert dropout_at("phi3", 0.2) == Dropout(attention=0.2, residual=0.2)
    assert dropout_from_config({"model_type": "unknown", "dropout": 0.5}) == Dropout()


def _tiny_gpt2(n_positions: int = 128):
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=n_positions, vocab_size=1000)  # dropout 0.1
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()


def _measured_peak(model, batch: int, seq: int) -> tuple[int, int]:
    from lmprof.workloads.training import plain_train_step
    from memory_step import measure_step_memory

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = plain_train_step(model, opt, lambda: torch.randint(0, 1000, (batch, seq)),
                            lambda m, x: m(input_ids=x, labels=x).loss)
    m = measure_step_memory(step, model, opt, "cpu", warmup=1)
    return int(m.value("peak")[0] or 0), int(m.value("activations")[0] or 0)


@pytest.mark.slow  # a whole lmprof train run (importing transformers alone takes seconds on a busy machine)
def test_hf_gpt2_training_run_estimate_follows_the_math_kernel(tmp_path) -> None:
    """lmprof train --hf-config tiny-gpt2 at a shape where the (b, a, s, s) tensors dominate: the run's
    estimated peak is within 10% of its measured peak; assuming fused attention (as before) is not."""
    pytest.importorskip("transformers")
    from lmprof.config import TrainConfig
    from lmprof.pipeline.train import run_training
    from lmprof.estimate.models import shape_from_config

    cfg = TrainConfig(hf_config="tiny-gpt2", batch_size=4, seq_len=128, steps=1, warmup=1, profile_steps=1,
                      device="cpu", energy="off", plots=False)
    run, _ = run_training(cfg, out_dir=tmp_path / "hf")
    measured, estimated = run.value("memory.peak"), run.value("memory.estimated.peak")
    assert measured and estimated
    assert estimated == pytest.approx(measured, rel=0.10)
    assert "math kernel" in (run.metrics["memory.estimated.activations"].note or "")
    # The old assumption (fused attention, no masks) misses the probabilities, masks and dropped copies.
    import transformers as tf

    shape = shape_from_config(tf.AutoConfig.for_model("gpt2", n_layer=2, n_head=2, n_embd=64, n_positions=128,
                                                       vocab_size=1000).to_dict())
    fused = estimate_memory(shape, batch=4, seq_len=128, attention="sdpa", device_kind="cpu")
    assert fused.peak < 0.9 * measured


def test_fit_check_never_promises_a_batch_over_budget() -> None:
    """Budgets between measured peaks: the largest batch the estimate accepts peaks under the budget."""
    pytest.importorskip("transformers")
    from lmprof.workloads.hf import shape_of
    from lmprof.workloads.hf_interface import training_dropout

    model = _tiny_gpt2()
    shape, drop = shape_of(model), training_dropout(model)
    assert shape is not None and drop == Dropout(0.1, 0.1, 0.1)
    seq = 96

    def at(b: int):
        return estimate_memory(shape, batch=b, seq_len=seq, attention="sdpa", device_kind="cpu", dropout=drop)

    peaks = {b: _measured_peak(_tiny_gpt2(), b, seq)[0] for b in (2, 3, 4)}
    for budget in (peaks[2] + (peaks[3] - peaks[2]) // 2, peaks[3] + (peaks[4] - peaks[3]) // 2):
        best = largest_fitting_batch(budget, at)
        assert 1 <= best <= 3
        assert peaks[best] <= budget
