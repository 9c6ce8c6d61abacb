"""The describer's training memory against a measured CPU training step of the real model.

For tiny dense, MoE, latent-attention, sliding-window and two hybrid configs, the estimate built
from what the describer read off the meta device (estimate/memory/from_facts.py) against
lmprof's measurement of a real random-weight model's fp32 AdamW step on the CPU
(through the figures step a run uses, tests/memory_step.py, after one warm-up step): the parameters and optimizer state exactly, the
activations (saved for backward) and the peak above the parameters and optimizer state (the
gradients made by then included on both sides) within 2.5% (measured: within 0.05%, but for the
linear-attention hybrid's activations, 1.8%, and the dense model's peak, 0.9%).
"""
from __future__ import annotations

import pytest

from memory_step import measure_step_memory

tf = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from lmprof.estimate.memory import estimate_memory  # noqa: E402
from lmprof.measure.model_facts import describe, transformers_config  # noqa: E402
from lmprof.workloads.training import plain_train_step  # noqa: E402

B, T = 4, 48
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "dense": dict(model_type="llama", **BASE),
    "moe": dict(model_type="qwen3_moe", **BASE, head_dim=16, moe_intermediate_size=32, num_experts=4,
                num_experts_per_tok=2),
    "latent": dict(model_type="deepseek_v3", **{**BASE, "num_key_value_heads": 4}, moe_intermediate_size=32,
                   n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                   topk_group=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                   v_head_dim=16, head_dim=8),
    "sliding": dict(model_type="mistral", **BASE, sliding_window=16),  # the window is shorter than T
    "linear-attention hybrid": dict(model_type="qwen3_next", **BASE, head_dim=16, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                    linear_value_head_dim=16),
    "SSM hybrid": dict(model_type="falcon_h1", **BASE, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
                       mamba_d_head=16, mamba_d_state=16),
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_training_memory_read_off_the_model_matches_a_measured_step(kind: str) -> None:
    cfg = CONFIGS[kind]
    facts = describe(dict(cfg), batch=B, seq_len=T, phases=("train",))
    est = estimate_memory(facts, batch=B, seq_len=T, device_kind="cpu")
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(transformers_config(dict(cfg))).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = plain_train_step(model, opt, lambda: torch.randint(3, 100, (B, T)),
                            lambda m, x: m(input_ids=x, labels=x).loss)
    measured = measure_step_memory(step, model, opt, "cpu", warmup=1)
    value = {k: measured.value(k)[0] for k in ("params", "grads", "optimizer", "activations", "peak")}
    assert (value["params"], value["grads"], value["optimizer"]) == (est.params, est.grads, est.optimizer_state)
    assert est.activations == pytest.approx(value["activations"], rel=0.025)
    static = est.params + est.optimizer_state
    assert est.peak - static == pytest.approx(value["peak"] - static, rel=0.025)


def test_the_saved_bytes_read_off_the_model_do_not_move_with_the_heap() -> None:
    """The latent-attention MoE's router saves tensors for nodes it then drops (scores used only for their
    indices). Keyed by storage address, a later saved storage at a freed one's address went uncounted: the
    activations moved by up to 4% from one description to the next in one process (5.03-5.25 MB against a
    measured 5.24 MB), and failed the test above in 1 of 3 full-suite runs."""
    got = set()
    for junk in (0, 3, 7):
        held = [torch.empty(1 << k, device="meta") for k in range(junk)]  # a different heap each time
        facts = describe(dict(CONFIGS["latent"]), batch=B, seq_len=T, phases=("train",))
        got.add(estimate_memory(facts, batch=B, seq_len=T, device_kind="cpu").activations)
        del held
    assert len(got) == 1, got


def test_estimate_memory_refuses_what_a_described_model_has_no_figures_for() -> None:
    """A model read off the meta device has figures in one dtype and none for adapters or a mask buffer:
    estimate_memory says so rather than return formulas' figures it did not compute."""
    from lmprof.errors import ConfigError
    from lmprof.estimate.memory import Lora

    facts = describe(dict(CONFIGS["dense"]), batch=B, seq_len=T, phases=("train",))
    for given, says in ((dict(param_dtype="bf16"), "read off the model in one dtype"),
                        (dict(lora=Lora(rank=8)), "LoRA/QLoRA is not modelled for 'llama'"),
                        (dict(buffers=0), "a causal-mask buffer size is not modelled for 'llama'")):
        with pytest.raises(ConfigError, match=says):
            estimate_memory(facts, batch=B, seq_len=T, **given)
