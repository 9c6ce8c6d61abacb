"""A fabricated sweep store for the plot and store tests: no process started, every figure present.

Two models x two batch sizes x two sequence lengths, train and infer, with energy, MFU, memory,
loss on text, per-block FLOPs/bytes and device peaks, plus one failed point of each kind, so every
plot has something to draw and every exclusion rule something to exclude.
"""
from __future__ import annotations

from pathlib import Path

from lmprof.record.run import Block, Env, Metric, Run
from lmprof.record.store import DB_NAME, Store
from lmprof.sweep.spec import parse_spec

BLOCKS = {
    "train": {"forward": ["embedding", "ln_1", "attn.qkv", "attn.scores", "attn.softmax", "attn.av", "attn.proj",
                          "ln_2", "mlp.fc", "mlp.act", "mlp.proj", "lm_head", "loss", "other"],
              "backward": ["attn.qkv", "attn.scores", "attn.softmax", "attn.av", "attn.proj", "mlp.fc", "mlp.act",
                           "mlp.proj", "lm_head", "other"],
              "step": ["optimizer", "data"]},
    "infer": {"prefill": ["embedding", "attn.qkv", "attn.scores", "attn.softmax", "attn.av", "attn.proj", "mlp.fc",
                          "mlp.act", "mlp.proj", "lm_head"],
              "decode": ["attn.qkv", "attn.scores", "attn.softmax", "attn.av", "attn.proj", "mlp.fc", "mlp.act",
                         "mlp.proj", "lm_head", "other"]},
}
SPEC = {
    "models": ["tiny", {"name": "wide", "n_layer": 2, "n_head": 4, "n_embd": 256}],
    "batch_sizes": [2, 8],
    "seq_lens": [32, 128],
    "modes": ["train", "infer"],
    "devices": ["cpu"],
    "data": "corpus.txt",
}
# Points that fail, by (mode, model, batch, seq): the statuses every plot must leave out.
FAILED = {
    ("train", "wide", 8, 128): ("oom", "out of memory"),
    ("infer", "wide", 8, 128): ("timeout", "no result after 1 s"),
}


def _run(point_id: str, mode: str, model: str, b: int, t: int) -> Run:
    scale = (4.0 if model == "wide" else 1.0) * b * t / 64
    tokens = b * t
    step_ms = 2.0 * scale + 1.0
    blocks = []
    for phase, names in BLOCKS[mode].items():
        for i, name in enumerate(names):
            ms = step_ms * (0.02 + 0.01 * i) * (2 if phase == "backward" else 1)
            flops = None if name in ("other", "optimizer", "data") else 1e6 * scale * (i + 1)
            nbytes = None if flops is None else 2e5 * (i + 1) * (1 + t / 64)
            blocks.append(Block(name=name, phase=phase, time_ms=ms, profiled_ms=ms * 1.1, pct=5.0, calls=1,
                                flops=flops, bytes=nbytes))
    m = {
        "params": Metric(value=1e5 * (4 if model == "wide" else 1), unit="count", source="measured"),
        "memory.peak": Metric(value=1e7 * scale, unit="B", source="measured"),
        "mfu": Metric(value=min(60.0, 5.0 * b * (2 if model == "wide" else 1)), unit="%", source="derived"),
        "peak.flops": Metric(value=1e12, unit="FLOP/s", source="estimated"),
        "peak.bandwidth": Metric(value=5e10, unit="B/s", source="estimated"),
        "energy.total": Metric(value=3.0 * scale, unit="J", source="measured"),
        "energy.flop_per_joule": Metric(value=1e9 * b, unit="FLOP/J", source="derived"),
    }
    per_token = 3.0 * scale / tokens / 10 * (1 + t / 256) / (1 + b / 8)
    if mode == "train":
        m["energy.per_token"] = Metric(value=per_token, unit="J/token", source="derived")
    else:  # inference names its unit, as lmprof infer does
        m["energy.per_generated_token"] = Metric(value=per_token, unit="J/generated token", source="derived")
    if mode == "train":
        m["step_time"] = Metric(value=step_ms, unit="ms", source="measured", p10=step_ms, p90=step_ms, n=3)
        m["tokens_per_s"] = Metric(value=tokens / step_ms * 1e3, unit="tokens/s", source="derived")
        m["loss"] = Metric(value=4.2 - (0.5 if model == "wide" else 0.0), unit="nats/token", source="measured")
    else:
        m["ttft"] = Metric(value=step_ms, unit="ms", source="measured")
        m["decode_tokens_per_s"] = Metric(value=b * 1000 / (1 + scale), unit="tokens/s", source="derived")
    env = Env(device="cpu", device_name="Fake CPU", torch="0", python="3", lmprof="0", os="test", cpu="fake", threads=1)
    return Run(id=point_id, mode=mode, created="2026-01-01T00:00:00+00:00", env=env, config={}, metrics=m,
               blocks=blocks)


# (mode, model, batch, seq) of the ok runs that judged their own timing noisy
NOISY = {("train", "wide", 2, 32): "other processes used 0.8 of a core during the timed window"}


def fake_sweep(folder: Path) -> Path:
    """Write a finished, fabricated sweep store into ``folder``; returns the folder."""
    spec = parse_spec(SPEC)
    plan = spec.expand()
    with Store(folder / DB_NAME) as store:
        store.plan(plan.points, spec.model_dump_json())
        for p in plan.points:
            store.mark_running(p.id, f"runs/{p.id}", "2026-01-01T00:00:00+00:00")
            failed = FAILED.get((p.mode, p.model, p.batch_size, p.seq_len))
            if failed:
                store.finish(p.id, failed[0], failed[1], "2026-01-01T00:00:01+00:00", 1.0)
            else:
                run = _run(p.id, p.mode, p.model, p.batch_size, p.seq_len)
                reason = NOISY.get((p.mode, p.model, p.batch_size, p.seq_len))
                if reason:
                    run.noisy, run.noise = True, [reason]
                store.finish(p.id, "ok", None, "2026-01-01T00:00:01+00:00", 1.0, run)
    return folder
