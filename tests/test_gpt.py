"""The built-in GPT: parameter counts by hand, presets, attention variants agree, KV cache."""
from __future__ import annotations

import pytest
import torch

from lmprof.errors import ConfigError
from lmprof.workloads.gpt import GPT, KVCache, preset


def hand_count(L, d, V, T, bias=True, tied=True):
    per_layer = (2 * d + 3 * d * d + 3 * d + d * d + d + 2 * d + 4 * d * d + 4 * d + 4 * d * d + d) if bias else (
        d + 3 * d * d + d * d + d + 8 * d * d)
    return V * d + T * d + L * per_layer + (2 * d if bias else d) + (0 if tied else V * d)


@pytest.mark.parametrize("name,L,d,V,T", [("tiny", 4, 128, 65, 256), ("small", 6, 384, 65, 256)])
def test_param_count_by_hand(name, L, d, V, T):
    cfg = preset(name)
    assert GPT(cfg).num_params() == hand_count(L, d, V, T) == cfg.shape().n_params()


def test_gpt2_preset_is_124m():
    assert preset("gpt2").shape().n_params() == 124_439_808


def test_untied_no_bias_shape_count_matches_model():
    cfg = preset("tiny", bias=False, tied=False)
    assert GPT(cfg).num_params() == cfg.shape().n_params() == hand_count(4, 128, 65, 256, bias=False, tied=False)


def test_math_and_sdpa_agree():
    torch.manual_seed(0)
    a = GPT(preset("tiny", attention="math")).eval()
    b = GPT(preset("tiny", attention="sdpa")).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randint(65, (2, 16))
    la, _ = a(x, x)
    lb, _ = b(x, x)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_kv_cache_decode_matches_full_forward(attention, static):
    """The KV cache, dynamic (eager) or static (compiled: all positions, masked, positions as
    tensors), gives the logits of a full forward over the sequence so far."""
    torch.manual_seed(0)
    m = GPT(preset("tiny", attention=attention)).eval()
    x = torch.randint(65, (2, 12))
    full = [m(x[:, : t + 1])[0][:, -1] for t in range(8, 12)]
    cache = KVCache(m.config, batch=2, max_len=12, device=torch.device("cpu"), dtype=torch.float32, static=static)
    logits, _ = m(x[:, :9], cache=cache, pos=torch.tensor(0) if static else 0)
    got = [logits[:, -1]]
    for t in range(9, 12):
        logits, _ = m(x[:, t : t + 1], cache=cache, pos=torch.tensor(t) if static else t)
        got.append(logits[:, -1])
    for f, g in zip(full, got):
        torch.testing.assert_close(f, g, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "kw,msg",
    [({"n_embd": 100, "n_head": 3}, "divisible"), ({"n_layer": 0}, "positive"), ({"dropout": 1.5}, "dropout")],
)
def test_bad_configs(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        preset("tiny", **kw)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")


def test_sequence_longer_than_context_is_an_error():
    m = GPT(preset("tiny", block_size=8))
    with pytest.raises(ConfigError, match="exceeds block_size"):
        m(torch.zeros(1, 9, dtype=torch.long))
