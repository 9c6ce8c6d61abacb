"""End to end (issue 31): training tiny OPT, Falcon, GPT-BigCode and Mixtral configs the way
``lmprof train --hf-config`` does, and a nanoGPT-style script under ``lmprof run``, gives attention-core
and residual rows, and leaves under 5% of the summed block time in ``other`` (measurements beside
the test).

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
PROTOCOL = dict(warmup=2, steps=3, profile_steps=5)  # a block is its median over the profiled steps: a preempted step is outvoted


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


_RUNS: dict[str, list[Run]] = {}  # family -> its runs so far (the rows test and the share test share them)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("blocks")


def _family_run(model_type: str, work: Path, i: int) -> Run:
    """The family's i-th run (each a fresh training run into its own folder)."""
    from lmprof.measure.profiler_cost import event_cost

    runs = _RUNS.setdefault(model_type, [])
    while len(runs) <= i:
        if runs:  # a retry is a new run: the profiler's cost (cached per process) is measured again too
            event_cost(refresh=True)
        out = work / f"{model_type}-runs{len(runs)}"
        if model_type == "nanogpt":
            runs.append(_run_nanogpt(out))
            continue
        config_path = work / model_type / "config.json"
        config_path.parent.mkdir(exist_ok=True)
        tf.AutoConfig.for_model(model_type, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                **TINY[model_type]).to_json_file(config_path)
        runs.append(_train_hf(config_path, out))
    return runs[i]


def _run_nanogpt(out: Path) -> Run:
    """`lmprof run` on the nanoGPT-style example script; the run loaded back."""
    proc = subprocess.run(
        [sys.executable, "-m", "lmprof", "run", "--no-report", "--out", str(out),
         *(f"--{k.replace('_', '-')}={v}" for k, v in PROTOCOL.items()),
         str(NANOGPT), "--max_iters=14", "--device=cpu", "--batch_size=4", "--block_size=32", "--n_embd=64"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    folders = [p for p in out.iterdir() if (p / "run.json").is_file()]
    assert len(folders) == 1, folders
    return Run.load(folders[0])


# What `other` was at these sizes before the rows below had names (best of three rounds, busy 2-core
# CPU): OPT 6.9-23%, Falcon 6.5-24%, GPT-BigCode 12.5-19.9%, Mixtral 5.2-8.6%, nanoGPT 9.4-20%. It was
# three things, none of them unclaimed work: the model's own top-level forward outside its modules
# (transformers' mask building and output objects, nanoGPT's position add; 10-12% of the forward),
# the loss computed inside that forward, and the autograd engine between backward nodes (9-12% of the
# step: about 4 us a node, a hundred nodes). They are the rows model_glue, loss and autograd_engine
# now. What is left is the loop between the phases (1.5-3.5%) and under 0.5% in the forward; quiet
# machine, one round each: OPT 1.9%, Falcon 2.0%, Mixtral 2.0%, nanoGPT 3.5%.
# nanoGPT's share sits near the bound on its own (3.9-4.1% on a quiet machine, its loop's work between the
# phases is ~0.11 ms of a 3.4 ms step): beside the other test worker every round of a clean clone's suite
# once measured 5.1-5.3%, so it is judged in the stopwatch stage, alone
@pytest.mark.parametrize("model_type", [*TINY, pytest.param("nanogpt", marks=pytest.mark.stopwatch)])
@pytest.mark.slow
def test_attention_core_residual_rows_and_other_under_5_percent(model_type: str, work: Path) -> None:
    run = _family_run(model_type, work, 0)
    names = {b.name for b in run.blocks}
    if model_type == "nanogpt":
        # nanoGPT's layout gets GPT-2's names: its attention module's own work (F.scaled_dot_product_attention
        # between c_attn and c_proj) is the attention core; no transformers config says fused or not
        assert names & {"attn.core", "attn.sdpa"}, sorted(names)
        core = (names & {"attn.core", "attn.sdpa"}).pop()
    else:
        core = _core_name(work / model_type / "config.json")
        assert core in names, sorted(names)
    assert "residual" in names, sorted(names)
    # the model's own forward and the loss it computes (transformers' loss_function, nanoGPT's cross_entropy)
    assert {"model_glue", "loss", "autograd_engine"} <= names, sorted(names)
    if model_type == "mixtral":  # the router and the routed experts: rows with their analytic FLOPs
        assert all(b.flops for b in run.blocks if b.name in ("moe.router", "moe.experts") and b.phase == "forward")
        assert {"moe.router", "moe.experts"} <= names and "mlp.fc" not in names, sorted(names)
    assert all(b.time_ms > 0 for b in run.blocks if b.name in (core, "residual"))
    # one run a family for both checks (rows and share); a preempted round is retried, the best judged
    shares = []
    for i in range(ROUNDS):
        shares.append(_other_share(_family_run(model_type, work, i)))
        if shares[-1] < SHARE:
            break
    assert min(shares) < SHARE, f"{model_type}: other is {[f'{s:.1%}' for s in shares]} of the summed block time"
