"""Module-path models get the attention core and residual adds as named blocks (issue 31).

OPT, Falcon, GPT-BigCode, Mixtral, Qwen2-MoE and a nanoGPT-style model: every module holding
parameters maps to a canonical block, the attention module's own work is attn.core and a layer's own
work (its residual adds) is residual. FlopCounterMode's per-module counts (eager attention) give the
modules named attn.core exactly the scores and AV matmuls (the analytic attn.scores + attn.av), and
the modules named residual no matmul FLOPs.
"""
from __future__ import annotations

import pytest

from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.estimate.models import shape_from_config
from lmprof.names import FORWARD_BLOCKS

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from lmprof.measure.flops import count_flops  # noqa: E402
from lmprof.workloads.hooks import block_names, family_of  # noqa: E402

TINY = {
    "opt": dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2, word_embed_proj_dim=32,
                max_position_embeddings=64),
    "falcon": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64),
    "gpt_bigcode": dict(n_embd=32, n_layer=2, n_head=2, n_positions=64),
    "mixtral": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, num_local_experts=2, max_position_embeddings=64),
    "qwen2_moe": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=32, max_position_embeddings=64),
}
CANONICAL = set(FORWARD_BLOCKS) | {"rope", "attn.core"}


def _hf(model_type: str):
    hc = tf.AutoConfig.for_model(model_type, vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 **TINY[model_type])
    torch.manual_seed(0)
    kw = {"experts_implementation": "eager"} if model_type in ("mixtral", "qwen2_moe") else {}
    return tf.AutoModelForCausalLM.from_config(hc, attn_implementation="eager", **kw).eval(), hc


class _Attn(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.c_attn, self.c_proj = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.attn_dropout, self.resid_dropout = torch.nn.Dropout(0.0), torch.nn.Dropout(0.0)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(x).split(d, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)))


class _Mlp(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        self.dropout = torch.nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class _Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = torch.nn.LayerNorm(d), _Attn(d, heads), torch.nn.LayerNorm(d), _Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(torch.nn.Module):
    """nanoGPT's module layout (model.py), written here: no config.model_type."""

    def __init__(self, d: int = 32, heads: int = 2, layers: int = 2, vocab: int = 64, block: int = 64) -> None:
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab, d), wpe=torch.nn.Embedding(block, d), drop=torch.nn.Dropout(0.0),
            h=torch.nn.ModuleList([_Block(d, heads) for _ in range(layers)]), ln_f=torch.nn.LayerNorm(d)))
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _check_names(model) -> dict[str, str]:
    names = block_names(model)
    for path, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            assert names.get(path) in CANONICAL, (path, names.get(path))
    blocks = set(names.values())
    assert {"attn.core", "residual", "attn.qkv", "attn.proj", "lm_head"} <= blocks
    # an MoE model's MLP rows are its router and experts (shared experts, when it has them, are mlp.*)
    assert "mlp.fc" in blocks or {"moe.router", "moe.experts"} <= blocks, blocks
    return names


@pytest.mark.parametrize("model_type", list(TINY))
def test_hf_module_path_families_get_attention_core_and_residual(model_type: str) -> None:
    model, hc = _hf(model_type)
    assert family_of(model) == model_type
    _check_names(model)
    B, T = 2, 10
    ids = torch.randint(3, 64, (B, T))
    names = block_names(model)
    with torch.no_grad():
        by_module = count_flops(lambda: model(input_ids=ids).logits).by_module  # FlopCounterMode's, inclusive

    def flops(path: str) -> int:  # FlopCounterMode names modules from the model's class down
        return by_module.get((f"{type(model).__name__}.{path}", "forward"), 0)

    def own(path: str) -> int:  # a module's FLOPs minus its children's
        children = [f"{path}.{c}" for c, _ in model.get_submodule(path).named_children()]
        return flops(path) - sum(flops(c) for c in children)

    shape = shape_from_config(hc.to_dict())
    costs = {c.name: c for c in block_costs(shape, batch=B, seq_len=T, phase="prefill", dtype="fp32",
                                            conventions=FlopConventions(prefill_logits="all"))}
    core = sum(own(p) for p, n in names.items() if n == "attn.core")
    assert core == pytest.approx(costs["attn.scores"].matmul_flops + costs["attn.av"].matmul_flops, rel=0.01)
    assert sum(own(p) for p, n in names.items() if n == "residual") == 0  # adds only: no matmul FLOPs
    qkv = sum(flops(p) for p, n in names.items() if n == "attn.qkv")
    assert qkv == pytest.approx(costs["attn.qkv"].matmul_flops, rel=0.01)


def test_nanogpt_layout_gets_gpt2_blocks() -> None:
    model = NanoGPT()
    assert family_of(model) == "gpt2"
    names = _check_names(model)
    assert names["transformer.h.0.attn"] == "attn.core" and names["transformer.h.1"] == "residual"
    assert names["transformer.h.0.mlp.gelu"] == "mlp.act"
