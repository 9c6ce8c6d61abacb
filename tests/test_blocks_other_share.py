"""End to end (issue 31): training tiny OPT, Falcon, GPT-BigCode and Mixtral configs the way
``lmprof train --hf-config`` does, and a nanoGPT-style script under ``lmprof run``, gives attention-core
and residual rows, and leaves under 5% of the summed block time in ``other``.

The attention core's name follows the attention the model really runs: transformers' own
``config._attn_implementation`` of the same architecture, built here (attn.sdpa for fused attention,
attn.core for eager). ``other`` is time inside a phase that no module claims, so it also soaks up a
busy machine's scheduling noise: like the repository's other timing-judged tests, a family gets up to
three rounds and the best one is judged.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.record.run import Run

tf = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
NANOGPT = ROOT / "docs" / "examples" / "nanogpt_train.py"
SHARE = 0.05  # the bound
ROUNDS = 3
# Tiny, but not so tiny that the per-step glue outside any module (the loss, the causal mask) is the step.
TINY = {
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=2, word_embed_proj_dim=64,
                max_position_embeddings=64),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=2, n_positions=64),
    "mixtral": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, num_local_experts=2, max_position_embeddings=64),
}
PROTOCOL = dict(warmup=2, steps=3, profile_steps=2)


def _other_share(run: Run) -> float:
    total = sum(b.time_ms for b in run.blocks)
    return sum(b.time_ms for b in run.blocks if b.name == "other") / total


def _core_name(config_path: Path) -> str:
    """attn.sdpa or attn.core, from the attention transformers itself picks for this architecture."""
    model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.from_pretrained(str(config_path)))
    impl = model.config._attn_implementation
    return "attn.sdpa" if impl in ("sdpa", "flash_attention_2", "flex_attention") else "attn.core"


def _train_hf(config_path: Path, out: Path) -> Run:
    """What `lmprof train --hf-config CONFIG --no-report` runs, through the Python API; the run loaded back."""
    from lmprof.config import TrainConfig, build
    from lmprof.pipeline.train import run_training

    cfg = build(TrainConfig, dict(hf_config=str(config_path), batch_size=4, seq_len=32, device="cpu", energy="off",
                                  plots=False, out=str(out), **PROTOCOL))
    _, folder = run_training(cfg)
    return Run.load(folder)


@pytest.mark.parametrize("model_type", list(TINY))
def test_hf_family_has_core_and_residual_rows_and_little_other(model_type: str, tmp_path: Path) -> None:
    config_path = tmp_path / model_type / "config.json"
    config_path.parent.mkdir()
    tf.AutoConfig.for_model(model_type, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            **TINY[model_type]).to_json_file(config_path)
    core = _core_name(config_path)
    shares = []
    for i in range(ROUNDS):
        run = _train_hf(config_path, tmp_path / f"runs{i}")
        names = {b.name for b in run.blocks}
        assert {core, "residual"} <= names, sorted(names)
        assert all(b.time_ms > 0 for b in run.blocks if b.name in (core, "residual"))
        shares.append(_other_share(run))
        if shares[-1] < SHARE:
            break
    assert min(shares) < SHARE, f"{model_type}: other is {[f'{s:.1%}' for s in shares]} of the summed block time"


def test_nanogpt_script_has_core_and_residual_rows_and_little_other(tmp_path: Path) -> None:
    shares = []
    for i in range(ROUNDS):
        out = tmp_path / f"runs{i}"
        proc = subprocess.run(
            [sys.executable, "-m", "lmprof", "run", "--no-report", "--out", str(out),
             *(f"--{k.replace('_', '-')}={v}" for k, v in PROTOCOL.items()),
             str(NANOGPT), "--max_iters=10", "--device=cpu", "--batch_size=4", "--block_size=32", "--n_embd=64"],
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        folders = [p for p in out.iterdir() if (p / "run.json").is_file()]
        assert len(folders) == 1, folders
        run = Run.load(folders[0])
        names = {b.name for b in run.blocks}
        # nanoGPT's layout gets GPT-2's names; its attention module's own work (F.scaled_dot_product_attention
        # between c_attn and c_proj) is the attention core
        assert "residual" in names and names & {"attn.core", "attn.sdpa"}, sorted(names)
        shares.append(_other_share(run))
        if shares[-1] < SHARE:
            break
    assert min(shares) < SHARE, f"nanoGPT: other is {[f'{s:.1%}' for s in shares]} of the summed block time"
