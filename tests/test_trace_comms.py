"""Communication per collective (issue 19): sizes, nccl-tests bandwidths, wait vs transfer across ranks.

Traces are written event by event; every expected figure is worked out by hand in the comments.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.analyze import analyze_table
from lmprof.trace.fanout import analyze_path
from lmprof.trace.comms import collective_kind
from lmprof.trace.load import load_trace
from test_trace_synthetic import Trace

DATA = Path(__file__).parent / "data" / "traces"
MIB = 1 << 20


def _coll(tr: Trace, at: float, kind: str, nelems: int, dtype: str, group: int, kernel: str, dur: float,
          out_nelems: int | None = None, seq: int | None = None) -> None:  # fmt: skip
    """A record_param_comms op (as PyTorch records it) around the launch of one NCCL kernel."""
    args = {"Collective name": kind, "In msg nelems": nelems, "Out msg nelems": out_nelems or nelems,
            "dtype": dtype, "Group size": group, "Process Group Name": "0"}  # fmt: skip
    if seq is not None:
        args["Seq"] = seq
    tr.host("record_param_comms", at, 20, **args)
    tr.kernel(kernel, at + 30, dur, stream=20, launch=(at + 5, 5))


def _rank(rank: int, durs: tuple[float, float, float], seq: bool = False) -> Trace:
    tr = Trace(rank=rank)
    # 1 MiB float all-reduce on 4 ranks; 8 MiB bf16 all-gather output (in 2 MiB x 4); 64 KiB broadcast
    _coll(tr, 0, "allreduce", MIB // 4, "Float", 4, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", durs[0],
          seq=1 if seq else None)  # fmt: skip
    _coll(tr, 1000, "_allgather_base", MIB, "BFloat16", 4, "ncclDevKernel_AllGather_RING_LL", durs[1],
          out_nelems=4 * MIB, seq=2 if seq else None)  # fmt: skip
    _coll(tr, 2000, "broadcast", 16384, "Float", 4, "ncclDevKernel_Broadcast_RING_LL", durs[2],
          seq=3 if seq else None)  # fmt: skip
    return tr


def test_sizes_and_bandwidths_follow_nccl_tests(tmp_path):
    cm = analyze_table(load_trace(_rank(0, (100.0, 800.0, 10.0)).write(tmp_path))).device.communication
    assert cm.collectives == 3 and cm.with_size == 3 and cm.source == "record_param_comms"
    by = {c.kind: c for c in cm.calls}
    ar, ag, bc = by["allreduce"], by["allgather"], by["broadcast"]
    # all-reduce: S = 262144 * 4 B = 1 MiB; algbw = 1048576 B / 100 us = 10.48576 GB/s; busbw x 2(4-1)/4 = 1.5
    assert ar.message_bytes == MIB and ar.algbw_gbps == pytest.approx(10.48576)
    assert ar.busbw_gbps == pytest.approx(10.48576 * 1.5)
    # all-gather: S = output 4 Mi elements x 2 B = 8 MiB; algbw = 8388608 / 800 us = 10.48576; busbw x 3/4
    assert ag.message_bytes == 8 * MIB and ag.algbw_gbps == pytest.approx(10.48576)
    assert ag.busbw_gbps == pytest.approx(10.48576 * 0.75)
    # broadcast: S = 16384 x 4 B = 65536 B; 65536 / 10 us = 6.5536 GB/s; busbw = algbw
    assert bc.message_bytes == 65536 and bc.algbw_gbps == pytest.approx(6.5536) == bc.busbw_gbps
    assert (ar.dtype, ar.group_size, ar.time_us) == ("Float", 4, 100.0)


@pytest.mark.parametrize("seq", [False, True])
def test_wait_and_transfer_across_ranks(tmp_path, seq):
    (tmp_path / "r").mkdir()
    _rank(0, (100.0, 800.0, 10.0), seq).write(tmp_path / "r", "rank0.json")
    _rank(1, (40.0, 900.0, 10.0), seq).write(tmp_path / "r", "rank1.json")
    rep = analyze_path(tmp_path / "r")
    cm = rep.collectives
    assert cm.matched == 3 and cm.unmatched == 0
    assert cm.match_by == ("sequence number" if seq else "order")
    r0, r1 = cm.ranks
    # per collective the shortest duration is the transfer: 40, 800, 10 -> 850 us
    assert r0.transfer_us == pytest.approx(850) and r1.transfer_us == pytest.approx(850)
    assert r0.wait_us == pytest.approx(60) and r1.wait_us == pytest.approx(100)  # 100-40; 900-800
    assert r0.time_us == pytest.approx(910) and r1.wait_pct == pytest.approx(100 * 100 / 950)


def test_unmatched_collectives_are_left_out(tmp_path):
    (tmp_path / "r").mkdir()
    _rank(0, (100.0, 800.0, 10.0)).write(tmp_path / "r", "rank0.json")
    tr = _rank(1, (40.0, 900.0, 10.0))
    _coll(tr, 3000, "allreduce", 8, "Float", 4, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5.0)
    tr.write(tmp_path / "r", "rank1.json")
    cm = analyze_path(tmp_path / "r").collectives
    assert (cm.matched, cm.unmatched) == (3, 1)


def test_kind_names():
    assert collective_kind("all_reduce") == collective_kind("allreduce_coalesced") == "allreduce"
    assert collective_kind("_reduce_scatter_base") == collective_kind("reduce_scatter_tensor") == "reduce_scatter"
    assert collective_kind("all_gather_into_tensor") == "allgather" and collective_kind("all_to_all") == "alltoall"


def test_real_traces(capsys):
    # a100_nccl: kernels carry their own args; 1.5 M-element float all-reduce on 2 ranks
    cm = analyze_table(load_trace(DATA / "a100_nccl_rank0.json.gz")).device.communication
    assert cm.collectives == 14 and cm.with_size == 14 and cm.source == "kernel args"
    big = max(cm.calls, key=lambda c: c.message_bytes)
    assert big.kind == "allreduce" and big.message_bytes == 7875584 * 4 and big.group_size == 2
    assert big.busbw_gbps == pytest.approx(big.algbw_gbps)  # 2(n-1)/n = 1 for n = 2
    assert big.algbw_gbps == pytest.approx(big.message_bytes / big.time_us / 1e3)
    # gpu_2rank: record_param_comms without parameters: kind from the kernel name, size unknown
    cm = analyze_table(load_trace(DATA / "gpu_2rank_rank0.json.gz")).device.communication
    assert cm.with_size == 0 and {c.kind for c in cm.calls} == {"sendrecv"}
    assert all(c.busbw_gbps is None for c in cm.calls)
    assert main(["analyze", str(DATA / "a100_nccl_rank0.json.gz")]) == 0
    assert "Collectives (14, sizes known for 14" in " ".join(capsys.readouterr().out.split())
