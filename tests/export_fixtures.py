"""A run folder written by hand for the exporter tests: known figures, blocks, a PNG, a trace, a report."""
from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

from lmprof.record.run import Block, Env, Metric, Run

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 65}


def png_bytes(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG, built from the format's chunks (so no image library is the truth here)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes([200, 10, 10]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def make_run(rid: str = "run-a", step_ms: float = 12.5) -> Run:
    metrics = {
        "step_time": Metric(value=step_ms, unit="ms", source="measured", p10=step_ms * 0.98, p90=step_ms * 1.03, n=10),
        "tokens_per_s": Metric(value=40960.0 / step_ms, unit="tokens/s", source="derived"),
        "mfu": Metric(value=12.25, unit="%", source="derived"),
        "memory.peak": Metric(value=123456789.0, unit="B", source="measured"),
        "params": Metric(value=834432.0, unit="count", source="measured"),
        "energy.total": Metric.na("J", "no RAPL powercap interface on this machine"),
    }
    blocks = [Block(name="attn.qkv", phase="forward", time_ms=step_ms * 0.25, profiled_ms=4.0, pct=25.0, calls=2),
              Block(name="mlp.fc", phase="backward", time_ms=step_ms * 0.75, profiled_ms=9.0, pct=75.0, calls=2)]
    return Run(id=rid, mode="train", created="2026-01-01T00:00:00Z",
               env=Env(device="cpu", device_name="t", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1),
               config={"preset": "tiny", "batch_size": 8, "model": dict(TINY)}, metrics=metrics, blocks=blocks,
               files={"trace": "trace.json.gz", "roofline": "roofline.png"})


def write_run(folder: Path, rid: str = "run-a", step_ms: float = 12.5) -> Path:
    """Save a hand-made run with its trace, plot and report beside run.json; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    (folder / "roofline.png").write_bytes(png_bytes())
    (folder / "report.html").write_text("<html><body>report</body></html>")
    make_run(rid, step_ms).save(folder)
    return folder


def write_sweep(folder: Path) -> Path:
    """A sweep folder with two finished points under runs/."""
    write_run(folder / "runs" / "p0", "p0", 10.0)
    write_run(folder / "runs" / "p1", "p1", 20.0)
    return folder
