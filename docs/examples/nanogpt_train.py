"""A tiny nanoGPT-style training script (nanoGPT's model.py layout: transformer.wte/wpe/h/ln_f, each
block's attn.c_attn/c_proj and mlp.c_fc/c_proj), trained on random tokens.

It knows nothing about lmprof: ``lmprof run docs/examples/nanogpt_train.py --batch_size=8`` profiles it,
and ``lmprof sweep docs/examples/nanogpt_sweep.yaml`` sweeps its batch size x block size.
Arguments are given as ``--name=value`` (nanoGPT's configurator style) or ``--name value``.
"""
import argparse

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=2)
parser.add_argument("--n_head", type=int, default=2)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--vocab_size", type=int, default=256)
parser.add_argument("--max_iters", type=int, default=20)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(args.n_embd, 3 * args.n_embd)
        self.c_proj = nn.Linear(args.n_embd, args.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, args.n_head, c // args.n_head).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(args.n_embd, 4 * args.n_embd), nn.GELU(), nn.Linear(4 * args.n_embd, args.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(args.n_embd), CausalSelfAttention()
        self.ln_2, self.mlp = nn.LayerNorm(args.n_embd), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(args.vocab_size, args.n_embd), wpe=nn.Embedding(args.block_size, args.n_embd),
            h=nn.ModuleList([Block() for _ in range(args.n_layer)]), ln_f=nn.LayerNorm(args.n_embd)))
        self.lm_head = nn.Linear(args.n_embd, args.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


torch.manual_seed(0)
model = GPT().to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for it in range(args.max_iters):
    x = torch.randint(args.vocab_size, (args.batch_size, args.block_size + 1), device=args.device)
    loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"{args.max_iters} iterations, last loss {loss.item():.3f}")
