"""Out of memory as one line: what ran out, how much was asked for, and what lmprof estimates would fit.

PyTorch reports a CPU out-of-memory as a RuntimeError ("DefaultCPUAllocator: can't allocate memory:
you tried to allocate N bytes"), CUDA as ``torch.OutOfMemoryError``, Python as MemoryError; all of
them become :class:`~lmprof.errors.OutOfMemory` here.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import re
from collections.abc import Iterator
from typing import Callable

from lmprof.config import InferConfig, TrainConfig
from lmprof.errors import OutOfMemory, is_oom

_TRIED_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_TRIED_UNITS = re.compile(r"tried to allocate ([\d.]+) (GiB|MiB|KiB|B)\b", re.IGNORECASE)
_UNIT = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}

# fit(budget_bytes) -> a phrase saying what would fit, or None when lmprof cannot tell.
Fit = Callable[[int], "str | None"]


def requested_bytes(text: str) -> int | None:
    """The size of the allocation that failed, when the allocator's message says it."""
    m = _TRIED_BYTES.search(text)
    if m:
        return int(m.group(1))
    m = _TRIED_UNITS.search(text)
    if m:
        return int(float(m.group(1)) * _UNIT[m.group(2).lower()])
    return None


def available_memory(device_kind: str = "cpu") -> int | None:
    """Bytes free for a new run: MemAvailable on Linux (sysconf elsewhere), total memory on a GPU."""
    if device_kind == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def human(n: float) -> str:
    """Bytes in binary units."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@contextlib.contextmanager
def oom_guard(what: str, fit: Fit | None = None, device_kind: str = "cpu", hint: str = "") -> Iterator[None]:
    """Turn an out-of-memory inside the block into OutOfMemory naming ``what`` ran out and what fits."""
    text = None
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not is_oom(exc):
            raise
        text = str(exc)
    if text is None:
        return
    gc.collect()  # the failed step's tensors are garbage now: measure what a new run would have
    asked = requested_bytes(text)
    free = available_memory(device_kind)
    parts = [f"out of memory {what}"]
    if asked is not None:
        parts.append(f"an allocation of {human(asked)} failed" + (f" with {human(free)} available" if free else ""))
    advice = None
    if fit is not None and free:
        with contextlib.suppress(Exception):  # an estimate that fails must not hide the OOM itself
            advice = fit(free)
    parts.append(advice or hint or "try a smaller --batch-size or --seq-len")
    raise OutOfMemory("; ".join(parts)) from None


def gpt_fit(cfg: TrainConfig | InferConfig, device_kind: str) -> Fit | None:
    """What would fit for the built-in GPT: the largest batch lmprof's memory estimate puts under the budget."""
    if cfg.hf or cfg.hf_config:
        return None

    def fit(budget: int) -> str | None:
        from lmprof.estimate.memory import MemoryEstimate, estimate_memory, largest_fitting_batch
        from lmprof.config import DEFAULT_SEQ_LEN
        from lmprof.workloads.gpt_config import preset

        gcfg = preset(cfg.preset, n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                      block_size=cfg.block_size, vocab_size=cfg.vocab_size, attention=cfg.attention)
        shape = gcfg.shape()
        if isinstance(cfg, TrainConfig):
            seq = cfg.seq_len or min(DEFAULT_SEQ_LEN.get(cfg.preset, 64), gcfg.block_size)
            optimizer = cfg.optimizer

            def at(b: int) -> MemoryEstimate:
                return estimate_memory(shape, batch=b, seq_len=seq, mode="train", dtype=cfg.dtype,
                                       attention=gcfg.attention, device_kind=device_kind, optimizer=optimizer)
        else:
            seq, new_tokens = cfg.prompt_len, cfg.new_tokens

            def at(b: int) -> MemoryEstimate:
                return estimate_memory(shape, batch=b, seq_len=seq, mode="infer", dtype=cfg.dtype,
                                       attention=gcfg.attention, device_kind=device_kind, new_tokens=new_tokens)

        best = largest_fitting_batch(budget, at)
        if best == 0:
            return f"lmprof's estimate says not even batch 1 at {seq} tokens fits in {human(budget)}: use a smaller model"
        return f"lmprof's estimate says --batch-size {best} at {seq} tokens fits in {human(budget)}"

    return fit


def matmul_fit(dtype_bytes: int = 4) -> Fit:
    """What would fit for calibrate's square matmuls: three n x n operands."""
    def fit(budget: int) -> str:
        n = int(math.sqrt(budget / (3 * dtype_bytes)))
        return f"square matmuls up to --sizes {n} fit (three {n} x {n} fp32 operands)"

    return fit
