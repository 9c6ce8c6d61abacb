"""Token batches: synthetic (default) or a character-level text file (nanoGPT's shakespeare_char).

Batches are produced on the CPU from a seeded generator so that two runs see the same inputs; moving
them to the device is part of the measured ``data`` block.
"""
from __future__ import annotations

from pathlib import Path
from typing import Collection, Iterator

import torch

from lmprof.errors import ConfigError, DataError


class TokenPool:
    """The token ids random text is drawn from: ``range(vocab_size)`` less ``avoid``, a model's special
    tokens, such as a multimodal model's image token, whose presence makes its forward expect what random
    text has not (pixels, padding). Built once: for a large vocabulary the pool takes 100-450 µs to build,
    which inside a training step's ``data`` block would be measured as the step's. With nothing to
    avoid, draws are the same stream as ``torch.randint``."""

    def __init__(self, vocab_size: int, avoid: Collection[int] = ()):
        skip = sorted({i for i in avoid if 0 <= i < vocab_size})
        if len(skip) >= vocab_size:
            raise ConfigError(f"every one of the model's {vocab_size} token ids is a special token")
        self.vocab_size = vocab_size
        self.ids: torch.Tensor | None = None
        if skip:
            allowed = torch.ones(vocab_size, dtype=torch.bool)
            allowed[skip] = False
            self.ids = allowed.nonzero().squeeze(1)

    def draw(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """Token ids of ``shape``, uniform over the pool."""
        if self.ids is None:
            return torch.randint(self.vocab_size, shape, generator=gen)
        return self.ids[torch.randint(self.ids.numel(), shape, generator=gen)]


def random_tokens(vocab_size: int, shape: tuple[int, ...], gen: torch.Generator,
                  avoid: Collection[int] = ()) -> torch.Tensor:
    """One draw of token ids from :class:`TokenPool` (a prompt; batches keep their pool)."""
    return TokenPool(vocab_size, avoid).draw(shape, gen)


class SyntheticBatches:
    """Uniform random tokens, seeded (the model's special tokens left out: :class:`TokenPool`). Targets
    are the inputs shifted by one, like real LM data."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, seed: int = 0, avoid: Collection[int] = ()):
        if batch_size <= 0:
            raise ConfigError(f"batch size must be positive, got {batch_size}")
        if seq_len <= 0:
            raise ConfigError(f"sequence length must be positive, got {seq_len}")
        self.vocab_size, self.batch_size, self.seq_len = vocab_size, batch_size, seq_len
        self.pool = TokenPool(vocab_size, avoid)
        self.gen = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.pool.draw((self.batch_size, self.seq_len + 1), self.gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class CharDataset:
    """A text file encoded one token per character; random windows as batches (seeded)."""

    def __init__(self, path: str | Path, batch_size: int, seq_len: int, seed: int = 0):
        p = Path(path)
        if not p.is_file():
            raise DataError(f"data file not found: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataError(f"data file {p} is not UTF-8 text") from None
        if len(text) < seq_len + 2:
            raise DataError(f"data file {p} has {len(text)} characters, fewer than seq_len+2 = {seq_len + 2}")
        if batch_size <= 0 or seq_len <= 0:
            raise ConfigError("batch size and sequence length must be positive")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        self.batch_size, self.seq_len = batch_size, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.data) - self.seq_len - 1, (self.batch_size,), generator=self.gen)
        x = torch.stack([self.data[s : s + self.seq_len] for s in starts.tolist()])
        y = torch.stack([self.data[s + 1 : s + 1 + self.seq_len] for s in starts.tolist()])
        return x, y
