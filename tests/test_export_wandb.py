"""lmprof export --to wandb in offline mode, read back from the run's .wandb file with wandb's own records.

wandb >= 0.2x keeps no Python reader of its transaction log (wandb-core, in Go, reads it), so the
framing (LevelDB's log format behind a 7-byte ':W&B' header) is undone here and every record is
parsed with wandb's own protobuf ``Record``; the values are wandb's JSON-encoded ``value_json``.
"""
from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from export_fixtures import make_run, write_run
from lmprof.cli.main import main

from lazy_imports import Lazy, missing  # noqa: E402

pytestmark = missing("wandb", "the wandb extra is not installed")
wandb_internal_pb2 = Lazy("wandb.proto.wandb_internal_pb2")  # imported when a test reads records

_BLOCK, _HEADER = 32768, 7


def read_records(path: Path) -> list[Any]:
    """Every whole Record in a .wandb file (LevelDB log framing: crc32c, length, type; FULL/FIRST/MIDDLE/LAST).

    A record the writer has not finished (a torn tail, as when wandb-core is still flushing) is left out,
    so the callers' poll for the closing 'exit' record reads it on a later pass.
    """
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # trailer of a block: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if pos + _HEADER + length > len(data):  # wandb-core is still writing this record: read it next time
            break
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


@pytest.mark.slow  # wandb starts its own service process: ~10-20 s on 2 busy cores
def test_offline_run_equals_run_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = write_run(tmp_path / "run-a")
    assert main(["export", str(run_dir), "--to", "wandb", "--dest", str(tmp_path / "wb"),
                 "--project", "proj"]) == 0
    out = capsys.readouterr().out
    (wandb_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    assert str(wandb_file.parent) in out
    # wandb-core (its own process) may still be flushing the log when finish() returns: wait for the
    # closing 'exit' record rather than race it.
    for _ in range(600):
        records = read_records(wandb_file)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds:
            break
        time.sleep(0.1)
    assert "exit" in kinds and "run" in kinds, kinds
    run_rec = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run_rec.display_name == "run-a" and run_rec.project == "proj"
    config = {item.key: json.loads(item.value_json) for item in run_rec.config.update}
    assert config["model"]["n_layer"] == 2 and config["batch_size"] == 8
    history: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:  # nested values (tables, images) come one leaf per item
                keys = list(item.nested_key) or [item.key]
                node = history
                for k in keys[:-1]:
                    node = node.setdefault(k, {})
                node[keys[-1]] = json.loads(item.value_json)
    truth = make_run()
    assert history["step_time_ms"] == truth.metrics["step_time"].value
    assert history["tokens_per_s"] == truth.metrics["tokens_per_s"].value
    assert history["mfu_pct"] == 12.25 and history["memory.peak_B"] == 123456789.0
    assert "energy.total_J" not in history
    assert history["blocks/attn.qkv/forward_ms"] == 3.125 and history["blocks/mlp.fc/backward_ms"] == 9.375
    assert history["blocks"]["_type"] == "table-file" and history["plots/roofline"]["_type"] == "image-file"
    # The table file wandb wrote holds the blocks as run.json has them.
    table = json.loads((wandb_file.parent / "files" / history["blocks"]["path"]).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [(r["name"], r["phase"], r["time_ms"]) for r in rows] == [(b.name, b.phase, b.time_ms) for b in truth.blocks]
    assert "artifact" in kinds
    art = next(r.artifact for r in records if r.WhichOneof("record_type") == "artifact"
               and r.artifact.type == "lmprof-run")
    assert {"report.html", "trace.json.gz", "run.json"} <= {e.path for e in art.manifest.contents}
    # A second export resumes the same W&B run (offline: another folder with the same id, which
    # `wandb sync` uploads into the one run).
    assert main(["export", str(run_dir), "--to", "wandb", "--dest", str(tmp_path / "wb"), "--project", "proj"]) == 0
    assert "(updated)" in capsys.readouterr().out
    folders = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    # offline-run-<date>_<time>-<run id>, and "-1" after it when both exports began in the same second
    ids = {re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(?:-\d+)?", f.name).group(1) for f in folders}
    assert len(folders) == 2 and ids == {run_rec.run_id}, folders


def test_reader_leaves_out_a_torn_tail(tmp_path: Path) -> None:
    """The poll above reads a file wandb-core may be writing: a record cut anywhere is left for later."""
    recs = [wandb_internal_pb2.Record(num=i) for i in range(1, 4)]
    recs[1].history.item.add(key="x", value_json="1" * 40)
    body = b"".join(struct.pack("<IHB", 0, len(r.SerializeToString()), 1) + r.SerializeToString() for r in recs)
    whole = b":W&B" + b"\0\0\0" + body
    path = tmp_path / "run-x.wandb"
    ends = []
    for cut in range(len(whole) - len(body), len(whole) + 1):
        path.write_bytes(whole[:cut])
        got = read_records(path)
        assert got == recs[:len(got)]  # a prefix of the records, never a parse error
        ends.append(len(got))
    assert ends[0] == 0 and ends[-1] == 3 and sorted(ends) == ends
