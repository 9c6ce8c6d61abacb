"""Measured runs and commands of hybrid models lmprof has no formulas for: the describer's figures.

Truths: the bytes of the cache tensors the real model holds after a whole generation (measured by
the run), FlopCounterMode's count of a real warm-up step (the run counts one for models without
formulas and notes both), and a measured CPU training step's memory.
"""
from __future__ import annotations

import json

import pytest

tf = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from lmprof.config import InferConfig, TrainConfig  # noqa: E402
from lmprof.pipeline.infer import run_inference  # noqa: E402
from lmprof.pipeline.train import run_training  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# LFM2's published layout: gated short convolutions, with attention in some layers.
LFM2 = dict(model_type="lfm2", **BASE, layer_types=["conv", "full_attention", "conv", "full_attention"],
            full_attn_idxs=[1, 3])
FALCON_H1 = dict(model_type="falcon_h1", **BASE, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                 mamba_d_state=16)


def _config(tmp_path, cfg: dict) -> str:
    path = tmp_path / f"{cfg['model_type']}.json"
    path.write_text(json.dumps(tf.AutoConfig.for_model(**cfg).to_dict()))
    return str(path)


def test_infer_of_a_hybrid_decodes_through_its_cache_and_counts_its_states(tmp_path) -> None:
    """lfm2 (convolutions + attention): the estimated cache (attention KV and conv state, read off the model)
    equals the bytes the run measured after the generation; blocks are named by mixer; prefill FLOPs read
    off the model equal FlopCounterMode's count on a warm-up generation (its ids avoid the pad token)."""
    cfg = InferConfig(hf_config=_config(tmp_path, LFM2), batch_size=2, prompt_ids=list(range(3, 11)), new_tokens=4,
                      steps=1, warmup=1, profile_steps=1, device="cpu", energy="off")
    run, _ = run_inference(cfg, out_dir=tmp_path / "r")
    m = run.metrics
    assert m["kv_cache"].value == m["kv_cache.estimated"].value > 0
    assert "conv state" in m["kv_cache.estimated"].note and "attention KV" in m["kv_cache.estimated"].note
    names = {b.name for b in run.blocks}
    assert {"conv.in_proj", "conv.core", "conv.out_proj", "attn.qkv", "attn.proj"} <= names
    assert any(n.startswith("prefill FLOPs read off the model") and "(equal)" in n for n in run.notes), run.notes
    assert m["prefill.flops.model_per_step"].value > 0 and m["decode.flops.model_per_step"].value > 0
    # One decode step's FLOPs are one token's work, far below a prefill's: the cache was used, never a re-run.
    assert m["decode.flops.model_per_step"].value / 3 < m["prefill.flops.model_per_step"].value / 4
    decode = {b.name: b.flops for b in run.blocks if b.phase == "decode" and b.flops}
    assert decode.get("conv.in_proj")


def test_train_of_a_hybrid_gets_ssm_blocks_flops_and_a_memory_estimate(tmp_path) -> None:
    """falcon_h1 (SSM + attention in each layer): SSM and attention blocks with FLOPs, training FLOPs read off
    the model equal to the warm-up step's count, and a memory estimate within 5% of the measured peak."""
    cfg = TrainConfig(hf_config=_config(tmp_path, FALCON_H1), batch_size=2, seq_len=16, steps=1, warmup=1,
                      profile_steps=1, device="cpu", energy="off")
    run, _ = run_training(cfg, out_dir=tmp_path / "r")
    flops = {b.name for b in run.blocks if b.flops}
    assert {"ssm.in_proj", "ssm.core", "ssm.out_proj", "attn.qkv"} <= flops
    assert any(n.startswith("training step FLOPs read off the model") and "(equal)" in n for n in run.notes), run.notes
    est, meas = run.metrics["memory.estimated.peak"].value, run.metrics["memory.peak"].value
    assert est == pytest.approx(meas, rel=0.05)


def test_commands_read_a_hybrid_off_the_model(tmp_path, capsys) -> None:
    """roofline and memory on a family without formulas: figures from the describer, ``source: model``."""
    from lmprof.cli.main import main

    path = _config(tmp_path, FALCON_H1)
    assert main(["roofline", "--model", path, "--device", "h100", "--seq-len", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "model" and {"ssm.core", "attn.qkv"} <= {b["name"] for b in out["blocks"]}
    assert main(["memory", "--model", path, "--device", "h100", "--seq-len", "32", "--batch-size", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "model" and out["peak"] > out["estimate"]["params"] > 0
    assert main(["memory", "--model", path, "--device", "h100", "--seq-len", "32", "--lora-rank", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LoRA/QLoRA is not modelled for 'falcon_h1'" in err[0]
