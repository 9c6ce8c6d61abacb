"""A model lmprof has no rules for (PyTorch's nn.Transformer language-modeling tutorial, as users copy it):
every leaf module is a block by its path, and so is every module with parameters of its own, whose work its
children do not hold. nn.MultiheadAttention computes its input projection and attention from its own
in_proj_weight and reads its out_proj child's weight without calling it: before, none of its work had a
row, and 30% of the step sat in model_glue. Truth: the script's own stopwatch around each self_attn call."""
from __future__ import annotations

import json
import statistics

import pytest

LOOP = """
import json, sys, time, torch
from torch import nn
class LM(nn.Module):
    def __init__(self, ntoken=500, d=96, heads=2, hidden=192, layers=2):
        super().__init__()
        self.embedding = nn.Embedding(ntoken, d)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, hidden, 0.0), layers,
                                             enable_nested_tensor=False)
        self.linear = nn.Linear(d, ntoken)
    def forward(self, src, mask):
        return self.linear(self.encoder(self.embedding(src), mask, is_causal=True))
torch.manual_seed(0)
model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mask = nn.Transformer.generate_square_subsequent_mask(32)
spent, began = [], []
for layer in model.encoder.layers:  # the script's own stopwatch around each attention call
    layer.self_attn.register_forward_pre_hook(lambda m, a: began.append(time.perf_counter()))
    layer.self_attn.register_forward_hook(lambda m, a, o: spent.append(time.perf_counter() - began.pop()))
per_step = []
for i in range(20):
    before = len(spent)
    out = model(torch.randint(0, 500, (32, 16)), mask)
    nn.functional.cross_entropy(out.view(-1, 500), torch.randint(0, 500, (32 * 16,))).backward()
    opt.step()
    opt.zero_grad()
    per_step.append(sum(spent[before:]) * 1e3)
json.dump(per_step, open(sys.argv[1], "w"))
"""


@pytest.mark.stopwatch  # a block row against the script's own stopwatch: alone, as the others are
def test_multihead_attention_has_its_row(run_script) -> None:
    done = run_script(LOOP)
    assert done.code == 0, done.err
    record = done.record
    # its ids are (sequence 32, batch 16), as nn.Transformer's default layout wants them (batch_first=False)
    assert (record["config"]["batch_size"], record["config"]["seq_len"]) == (16, 32)
    rows: dict[tuple[str, str], float] = {}
    for b in record["blocks"]:  # per-layer rows: self_attn[0], [1]
        key = (b["name"].split("[")[0], b["phase"])
        rows[key] = rows.get(key, 0.0) + b["time_ms"]
    attn = rows.get(("encoder.layers.*.self_attn", "forward"), 0.0)
    truth = statistics.median(done.own)  # both layers' attention forwards, a step
    assert attn == pytest.approx(truth, rel=0.35)
    assert rows[("encoder.layers.*.self_attn", "backward")] > 0
    assert rows.get(("model_glue", "forward"), 0.0) < 0.5 * attn  # where the attention's time was


def test_ids_a_seq_first_model_transposes_itself_stay_batch_first(run_script) -> None:
    """The same model fed (batch 16, sequence 32) ids that it transposes itself: read as they are."""
    done = run_script(LOOP.replace("self.encoder(self.embedding(src), mask, is_causal=True)",
                                   "self.encoder(self.embedding(src).transpose(0, 1), mask, is_causal=True)"
                                   ".transpose(0, 1)")
                      .replace("torch.randint(0, 500, (32, 16))", "torch.randint(0, 500, (16, 32))")
                      .replace("json.dump(per_step, open(sys.argv[1], \"w\"))", ""))
    assert done.code == 0, done.err
    config = done.record["config"]
    assert (config["batch_size"], config["seq_len"]) == (16, 32)


CUSTOM = """
import torch, torch.nn as nn, torch.nn.functional as F
class Attention(nn.Module):  # a hand-written attention: projections as children, the attention in its forward
    def __init__(self, d, h):
        super().__init__(); self.h = h; self.qkv = nn.Linear(d, 3 * d); self.out = nn.Linear(d, d)
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
class Layer(nn.Module):
    def __init__(self, d, h):
        super().__init__(); self.n1, self.attn, self.n2 = nn.LayerNorm(d), Attention(d, h), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.ff(self.n2(x))
class LM(nn.Module):
    def __init__(self, V=128, d=64, h=4, L=2):
        super().__init__(); self.tok = nn.Embedding(V, d); self.layers = nn.ModuleList(Layer(d, h) for _ in range(L))
        self.head = nn.Linear(d, V)
    def forward(self, idx):
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
torch.manual_seed(0)
m = LM(); opt = torch.optim.AdamW(m.parameters(), 3e-4)
for i in range(18):
    x = torch.randint(0, 128, (4, 128))
    F.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward(); opt.step(); opt.zero_grad()
"""


def test_a_hand_written_attention_core_is_its_modules_row(run_script) -> None:
    """The attention between the projections (F.scaled_dot_product_attention, in the module's own forward)
    was model_glue; now its module's row. Truth: torch's own trace, event by event: the innermost lmprof
    range around every SDPA operator."""
    import gzip

    done = run_script(CUSTOM)
    assert done.code == 0, done.err
    folder = done.folder
    events = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    ranges = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("lmprof:")]
    sdpa = [e for e in events if e.get("ph") == "X" and e.get("name") == "aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert sdpa
    for op in sdpa:
        around = [r for r in ranges if r["tid"] == op["tid"] and r["ts"] <= op["ts"]
                  and op["ts"] + op["dur"] <= r["ts"] + r["dur"]]
        innermost = min(around, key=lambda r: r["dur"])
        assert innermost["name"].startswith("lmprof:layers.*.attn["), innermost["name"]
    rows: dict[tuple[str, str], float] = {}
    for b in json.loads((folder / "run.json").read_text())["blocks"]:
        key = (b["name"].split("[")[0], b["phase"])
        rows[key] = rows.get(key, 0.0) + b["time_ms"]
    assert rows[("model_glue", "forward")] < 0.2 * rows[("layers.*.attn", "forward")]
