"""A seeded trace fuzzer: byte flips, field mutations and truncations of the real traces in tests/data.

Every case must either load and analyse, or raise DataError (one line) — never another exception
and never hang. A handful of the cases also go through the CLI in a child process. Seeds are fixed,
so a failure names the case that reproduces it (``FUZZ_CASES`` / ``FUZZ_SEED`` widen the run).
"""
from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest

from lmprof.errors import DataError
from lmprof.trace.analyze import analyze_table, combine
from lmprof.trace.load import load_trace

DATA = Path(__file__).parent / "data" / "traces"
SRC = Path(__file__).resolve().parents[1] / "src"
SEED = int(os.environ.get("FUZZ_SEED", "20261123"))
CASES = int(os.environ.get("FUZZ_CASES", "160"))  # FUZZ_CASES=5000 for a longer hunt
# byte-level mutations use every trace; JSON-level ones the small traces (re-serialising is the cost)
BYTE_TRACES = [
    "a100_alexnet_cuda_sync", "a100_triton_kernel", "amd_mi250_train", "cpu_only_tiny", "cpu_ops_only",
    "gpu_2rank_rank0", "a100_nccl_rank0",
]  # fmt: skip
FIELD_TRACES = ["a100_alexnet_cuda_sync", "a100_triton_kernel", "amd_mi250_train", "cpu_only_tiny"]

HOSTILE: list[Any] = [
    None, True, -1, 0, 2**63, 2**64, -(2**70), 10**30, 1e308, -1e308, 1.5, float("nan"), "", "0x7",
    "ProfilerStep#99999999999999999999999", "\ud800", "x" * 5000, [], [1, [2, [3]]], {}, {"a": {"b": 1}},
    "<script>alert(1)</script>", "kernel", "cuda_runtime", "ProfilerStep#5",
]  # fmt: skip
FIELDS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args"]
ARG_FIELDS = [
    "correlation", "External id", "Sequence number", "stream", "device", "Collective name", "In msg nelems",
    "Out msg nelems", "dtype", "Group size", "Seq", "registers per thread", "blocks per SM", "bytes",
    "est. achieved occupancy %",
]
STRUCTURAL = b'{}[]",:\\0e-'


@lru_cache(maxsize=None)
def _raw(name: str) -> bytes:
    return gzip.decompress((DATA / f"{name}.json.gz").read_bytes())


@lru_cache(maxsize=None)
def _parsed(name: str) -> str:
    return _raw(name).decode()


def _flip(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] = rng.choice(STRUCTURAL) if rng.random() < 0.6 else rng.randrange(256)
    return bytes(b)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def _splice(rng: random.Random, data: bytes) -> bytes:
    i, j = sorted(rng.randrange(len(data)) for _ in range(2))
    k = rng.randrange(len(data))
    return data[:k] + data[i : min(j, i + 4096)] + data[k:] if rng.random() < 0.5 else data[:i] + data[j:]


def _field(rng: random.Random, name: str) -> bytes:
    doc = json.loads(_parsed(name))
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 6)):
        value = rng.choice(HOSTILE)
        r = rng.random()
        if r < 0.1:
            doc["distributedInfo"] = {"rank": value} if rng.random() < 0.7 else value
        elif r < 0.15:
            doc["deviceProperties"] = value
        elif r < 0.2:
            events.insert(rng.randrange(len(events) + 1), value)
        else:
            ev = events[rng.randrange(len(events))]
            if not isinstance(ev, dict):
                continue
            if rng.random() < 0.4:
                args = ev.setdefault("args", {})
                if isinstance(args, dict):
                    args[rng.choice(ARG_FIELDS)] = value
            else:
                ev[rng.choice(FIELDS)] = value
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


def _case(i: int) -> tuple[str, bytes, bool]:
    """Case ``i``: (description, bytes, gzip them)."""
    rng = random.Random(SEED * 1_000_003 + i)
    kind = rng.choice(["flip", "flip", "truncate", "splice", "field", "field", "field", "gzip"])
    if kind == "field":
        name = rng.choice(FIELD_TRACES)
        return f"{kind}:{name}", _field(rng, name), rng.random() < 0.3
    name = rng.choice(BYTE_TRACES)
    data = _raw(name)
    if kind == "gzip":  # damage the compressed stream itself
        z = gzip.compress(data, compresslevel=1, mtime=0)
        return f"{kind}:{name}", _flip(rng, z) if rng.random() < 0.5 else _truncate(rng, z), False
    mutate: Callable[[random.Random, bytes], bytes] = {"flip": _flip, "truncate": _truncate, "splice": _splice}[kind]
    return f"{kind}:{name}", mutate(rng, data), rng.random() < 0.2


def _write(folder: Path, i: int) -> tuple[str, Path]:
    what, data, gz = _case(i)
    path = folder / (f"case{i}.json.gz" if gz or what.startswith("gzip") else f"case{i}.json")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return what, path


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fuzzed_traces_load_or_fail_cleanly(tmp_path):
    outcomes = {"analysed": 0, "noted": 0, "refused": 0}
    for i in range(CASES):
        what, path = _write(tmp_path, i)
        try:
            table = load_trace(path)
            report = combine([analyze_table(table)])
            report.to_dict()
            outcomes["noted" if table.notes else "analysed"] += 1
        except DataError as exc:
            assert "\n" not in str(exc), (i, what)
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - the point: name the case that broke
            raise AssertionError(f"case {i} ({what}, seed {SEED}): {type(exc).__name__}: {exc}") from exc
        path.unlink()
    # the fuzzer must exercise every path, not only refusals
    assert all(n > 0 for n in outcomes.values()), outcomes


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fuzzed_traces_through_the_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for i in range(6):
        _, path = _write(tmp_path, CASES + i)
        for extra in ([], ["--json"]):
            proc = subprocess.run(
                [sys.executable, "-m", "lmprof", "analyze", str(path), *extra],
                capture_output=True, text=True, timeout=120, env=env,
            )  # fmt: skip
            assert "Traceback" not in proc.stderr, (i, proc.stderr[-2000:])
            assert proc.returncode in (0, 2), (i, proc.returncode, proc.stderr[-2000:])
            if proc.returncode == 2:
                lines = proc.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("lmprof: error:"), proc.stderr
