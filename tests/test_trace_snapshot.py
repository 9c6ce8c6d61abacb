"""`lmprof analyze SNAPSHOT.pickle`: a CUDA memory snapshot, written here by hand in the format of
``torch.cuda.memory._dump_snapshot`` (torch/_utils.py's _Snapshot), read without running anything."""
from __future__ import annotations

import json
import os
import pickle

import pytest

from lmprof.cli.main import main
from lmprof.trace import snapshot as snap_mod
from lmprof.trace.snapshot import read_snapshot, snapshot_report

MIB = 1 << 20
USER = {"filename": "/home/me/train.py", "line": 42, "name": "forward"}
OPT = {"filename": "/usr/lib/python3/site-packages/torch/optim/adam.py", "line": 7, "name": "_init_group"}
TORCH = {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
STEP = {"filename": "/home/me/train.py", "line": 60, "name": "main"}


def _block(size, state="active_allocated", frames=()):
    return {"size": size, "requested_size": size - 8 if size else 0, "address": 0, "state": state,
            "frames": list(frames)}


def _snapshot() -> dict:
    """Device 0: a 20 MiB segment (8 MiB activations from train.py:42, 4 MiB Adam state, 8 MiB free)
    and a 2 MiB segment (1 MiB pending free); its history allocates 6 MiB and frees it before the
    snapshot (so the peak is above now), then an OOM asking for 64 MiB."""
    seg0 = {"device": 0, "address": 0, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
            "allocated_size": 12 * MIB, "active_size": 12 * MIB,
            "blocks": [_block(8 * MIB, frames=[TORCH, USER]), _block(4 * MIB, frames=[OPT, STEP]),
                       _block(8 * MIB, "inactive")]}
    seg1 = {"device": 0, "address": 1 << 30, "total_size": 2 * MIB, "stream": 0, "segment_type": "small",
            "allocated_size": MIB, "active_size": MIB, "blocks": [_block(MIB, "active_pending_free"), _block(MIB, "inactive")]}
    trace = [
        {"action": "alloc", "addr": 1, "size": 6 * MIB, "stream": 0, "time_us": 100, "frames": [USER]},
        {"action": "alloc", "addr": 2, "size": 4 * MIB, "stream": 0, "time_us": 200, "frames": [OPT]},
        {"action": "free_requested", "addr": 1, "size": 6 * MIB, "stream": 0, "time_us": 300, "frames": []},
        {"action": "free_completed", "addr": 1, "size": 6 * MIB, "stream": 0, "time_us": 310, "frames": []},
        {"action": "oom", "size": 64 * MIB, "stream": 0, "device_free": 3 * MIB, "time_us": 400, "frames": [TORCH, USER]},
    ]
    return {"segments": [seg0, seg1], "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def test_figures_by_hand(tmp_path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    rep = snapshot_report(read_snapshot(path), str(path))
    (d,) = rep.devices
    assert (d.segments, d.reserved_bytes, d.allocated_bytes) == (2, 22 * MIB, 13 * MIB)
    # backwards from 13 MiB now: before the free 19 MiB, before the 4 MiB alloc 15, before the 6 MiB one 9
    assert (d.peak_allocated_bytes, d.peak_at_us, d.trace_entries) == (19 * MIB, 200.0, 5)
    (oom,) = rep.ooms
    assert (oom.requested_bytes, oom.device_free_bytes, oom.allocated_bytes, oom.at_us) == (64 * MIB, 3 * MIB, 13 * MIB, 400.0)
    assert oom.frame == "/home/me/train.py:42 forward"  # the user's line, not torch's
    assert [a.bytes for a in rep.top] == [8 * MIB, 4 * MIB, MIB]
    assert rep.top[0].frame == "/home/me/train.py:42 forward" and rep.top[0].category == "forward"
    assert rep.top[1].category == "optimizer" and rep.top[1].frame == "/home/me/train.py:60 main"
    assert rep.categories_bytes == {"optimizer": 4 * MIB, "forward": 8 * MIB, "no stack": MIB}
    assert [(r.frame, r.blocks, r.bytes) for r in rep.frames] == [
        ("/home/me/train.py:42 forward", 1, 8 * MIB), ("/home/me/train.py:60 main", 1, 4 * MIB), ("(no stack)", 1, MIB)]


def test_cli_json_and_table(tmp_path, capsys) -> None:
    path = tmp_path / "snapshot.bin"  # found by its pickle header, whatever the name
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "lmprof.snapshot/1" and doc["devices"][0]["peak_allocated_bytes"] == 19 * MIB
    assert main(["analyze", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console may wrap lines
    assert "peak allocated 19.00 MiB" in out and "OOM on cuda:0: asked 64.00 MiB" in out and "train.py:42" in out
    assert main(["analyze", str(path), "--annotate", str(tmp_path / "o.json")]) == 2
    assert "not on a memory snapshot" in capsys.readouterr().err


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


@pytest.mark.parametrize("payload", [
    pickle.dumps(_Evil()),
    pickle.dumps({"segments": [_Evil()]}),
    pickle.dumps(_Evil(), protocol=0),
    b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",  # STACK_GLOBAL by hand
    pickle.dumps({"no": "segments"}),
    pickle.dumps([1, 2, 3]),
    pickle.dumps(_snapshot())[:200],  # truncated
    b"",
    b"\x80\x05junk",
])
def test_hostile_pickles_are_one_line_and_run_nothing(tmp_path, capsys, monkeypatch, payload) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "snap.pickle"
    path.write_bytes(payload)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmprof: error: ") and err.count("\n") == 1
    assert not (tmp_path / "PWNED").exists()


def test_size_is_bounded(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    monkeypatch.setattr(snap_mod, "MAX_BYTES", 100)
    assert main(["analyze", str(path)]) == 2
    assert "limit" in capsys.readouterr().err


def test_odd_entries_are_left_out_with_a_note(tmp_path) -> None:
    s = _snapshot()
    s["segments"].append("junk")
    s["segments"][0]["blocks"].append({"size": "big", "state": "active_allocated"})
    s["device_traces"][0].insert(0, 7)
    rep = snapshot_report(s)
    assert rep.devices[0].allocated_bytes == 13 * MIB and any("2 segment(s) or block(s)" in n for n in rep.notes)
