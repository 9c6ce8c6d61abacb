"""A built-in run turns the scopes inside models off for ``--compile`` (a compiled model guards on the flag);
the process keeps its own setting after the run, however the run ended.

Found when the suite ran in another order: after ``lmprof infer --compile --no-kv-cache`` (refused, exit 2)
in the same process, the built-in GPT's sub-blocks got no FLOPs (attn.qkv: 0 against 3,145,728) and no
time: the option had switched the flag off before the refusal, and nothing switched it back. A notebook
that calls ``run_inference`` with ``compile=True`` and then profiles a model with scopes met the same.
Truth: the hand count of the query/key/value projection's FLOPs, 2 x tokens x d x 3d a layer.
"""
from __future__ import annotations

import pytest
import torch

from lmprof.errors import ConfigError
from lmprof.measure.flops import count_gpt_flops
from lmprof.workloads import blocks
from lmprof.workloads.gpt import GPT, GPTConfig

B, T, D, LAYERS = 2, 32, 64, 2


def _qkv_forward_flops() -> float:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=LAYERS, n_head=4, n_embd=D, block_size=64, vocab_size=65, attention="math"))
    counts = count_gpt_flops(model, batch=B, seq_len=T, mode="train")
    return counts.by_block[("attn.qkv", "forward")]


def test_a_refused_compile_option_leaves_the_models_scopes_on(cli) -> None:
    code, _, err = cli("infer", "--device", "cpu", "--compile", "--no-kv-cache")
    assert code == 2 and "--compile for inference needs a KV cache" in err
    assert _qkv_forward_flops() == 2 * (B * T) * D * (3 * D) * LAYERS  # 3,145,728; was 0


def test_the_setting_comes_back_whatever_ends_the_run() -> None:
    with pytest.raises(ConfigError):
        with blocks.model_scopes_kept():
            blocks.model_scopes(False)  # as a --compile run sets it
            raise ConfigError("the run fails")
    assert _qkv_forward_flops() == 2 * (B * T) * D * (3 * D) * LAYERS
