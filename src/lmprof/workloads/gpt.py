"""The built-in GPT: nanoGPT's model, with a named scope around every sub-block and a KV cache.

Read it beside the per-block table: each ``scope("...")`` below is one row of that table. Shapes are
noted at line ends as in nanoGPT: B batch, T new tokens, S tokens attended to, C = n_embd,
nh heads, hs head size.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from lmprof.errors import ConfigError
from lmprof.workloads.blocks import scope

# The config and presets live apart (torch-free); imported here for the model and its callers.
from lmprof.workloads.gpt_config import PRESETS, Attention, GPTConfig, preset  # noqa: F401


class KVCache:
    """Pre-allocated keys and values for every layer: n_layer tensors of (B, nh, max_len, hs) each.

    Dynamic (eager): ``pos`` is a Python int and attention sees the S = pos + T positions written so
    far, so every decode step has new shapes. Static (``static=True``, used under torch.compile):
    ``pos`` is a tensor of the T positions to write, and attention always sees all max_len positions,
    the ones not written yet hidden by the causal mask: every decode step has the same shapes, so a
    compiled model compiles decode once. One tensor per layer, so that a compiled graph writes into
    each in place (a write into a view of one big tensor would make it copy the whole cache back).
    """

    def __init__(self, cfg: GPTConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype,
                 static: bool = False):
        hs = cfg.n_embd // cfg.n_head
        shape = (batch, cfg.n_head, max_len, hs)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.max_len = max_len
        self.static = static
        if static:  # CUDA graphs (reduce-overhead) may then write the cache in place, no copies
            for t in [*self.k, *self.v]:
                torch._dynamo.mark_static_address(t)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               pos: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, nh, T, hs) at positions pos..pos+T (static: at the positions in ``pos``);
        return all keys/values so far (static: all max_len of them)."""
        if self.static:
            assert isinstance(pos, torch.Tensor)
            self.k[layer].index_copy_(2, pos, k)
            self.v[layer].index_copy_(2, pos, v)
            return self.k[layer], self.v[layer]
        assert isinstance(pos, int)
        t = k.size(2)
        self.k[layer][:, :, pos : pos + t] = k
        self.v[layer][:, :, pos : pos + t] = v
        return self.k[layer][:, :, : pos + t], self.v[layer][:, :, : pos + t]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.k, *self.v])


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    mask: torch.Tensor  # a buffer (register_buffer below): declared so the checker knows it is a tensor

    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
        self.attention = cfg.attention
        self.layer = layer
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def causal(self, pos: int | torch.Tensor, T: int, S: int) -> torch.Tensor:
        """Rows of the causal mask for the new positions, over S keys: (1, 1, T, S). Row p hides the
        keys after p: with a static cache, the positions not written yet."""
        if isinstance(pos, torch.Tensor):  # a static cache's positions
            return self.mask[:, :, pos, :S]
        return self.mask[:, :, pos : pos + T, :S]

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, pos: int | torch.Tensor = 0) -> torch.Tensor:
        # pos: the first new position (int), or with a static cache the T new positions (tensor)
        B, T, C = x.size()
        nh, hs = self.n_head, C // self.n_head
        with scope("attn.qkv"):
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            if cache is not None:
                k, v = cache.update(self.layer, k, v, pos)  # (B, nh, S, hs), S = pos + T (static: max_len)
        S = k.size(2)
        static = cache is not None and cache.static
        if self.attention == "sdpa":
            with scope("attn.sdpa"):
                drop = self.dropout if self.training else 0.0
                if T == 1 and not static:  # one new token attends to everything before it: no mask needed
                    y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
                elif S == T:
                    y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
                else:
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal(pos, T, S), dropout_p=drop)
                y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        else:
            with scope("attn.scores"):
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
                att = att.masked_fill(~self.causal(pos, T, S), float("-inf"))
            with scope("attn.softmax"):
                att = F.softmax(att, dim=-1)
                att = self.attn_dropout(att)
            with scope("attn.av"):
                y = att @ v  # (B, nh, T, hs)
                y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        with scope("attn.proj"):
            out: torch.Tensor = self.resid_dropout(self.c_proj(y))  # (B, T, C)
        return out


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with scope("mlp.fc"):
            x = self.c_fc(x)  # (B, T, 4C)
        with scope("mlp.act"):
            x = self.gelu(x)
        with scope("mlp.proj"):
            x = self.dropout(self.c_proj(x))  # (B, T, C)
        return x


class Layer(nn.Module):
    """One transformer layer (nanoGPT's ``Block``; "block" in lmprof means a timed sub-block)."""

    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, pos: int | torch.Tensor = 0) -> torch.Tensor:
        with scope("ln_1"):
            h = self.ln_1(x)
        h = self.attn(h, cache, pos)
        with scope("residual"):
            x = x + h
        with scope("ln_2"):
            h = self.ln_2(x)
        h = self.mlp(h)
        with scope("residual"):
            x = x + h
        return x


class Trunk(nn.ModuleDict):
    """nanoGPT's ``transformer`` dict (same keys, so the same parameter names and state_dict), its
    entries declared so that ``tr.h`` reads as a ModuleList, not as any tensor or module."""

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Dropout
    h: nn.ModuleList
    ln_f: LayerNorm


class GPT(nn.Module):
    """nanoGPT's GPT. ``forward(idx, targets)`` returns (logits, loss) like nanoGPT."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.transformer = Trunk(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Layer(cfg, i) for i in range(cfg.n_layer)]),
                ln_f=LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        pos: int | torch.Tensor = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``pos``: the first new token's position; a 0-d tensor with a static cache (the caller
        checks it against block_size: a compiled graph cannot raise on a tensor's value)."""
        b, t = idx.size()
        static = cache is not None and cache.static
        if not static and pos + t > self.config.block_size:
            raise ConfigError(f"sequence of {pos + t} tokens exceeds block_size {self.config.block_size}")
        tr = self.transformer
        with scope("embedding"):
            if static:  # pos is a tensor: no Python int for torch.compile to specialise on
                positions = pos + torch.arange(t, dtype=torch.long, device=idx.device)  # (T,)
            else:
                assert isinstance(pos, int)  # a dynamic cache (or none) counts positions in Python
                positions = torch.arange(pos, pos + t, dtype=torch.long, device=idx.device)
            x = tr.drop(tr.wte(idx) + tr.wpe(positions))  # (B, T, C)
        for block in tr.h:
            x = block(x, cache, positions if static else pos)
        with scope("ln_f"):
            x = tr.ln_f(x)
        if targets is not None:
            with scope("lm_head"):
                logits = self.lm_head(x)  # (B, T, vocab)
            with scope("loss"):
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        with scope("lm_head"):
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position, (B, 1, vocab)
        return logits, None
