"""The critical path across ranks (issue 19): traces written event by event, waits worked out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.fanout import analyze_path
from test_trace_synthetic import Trace

DATA = Path(__file__).parent / "data" / "traces"


def _rank(rank: int, gemm_us: float, ar_start: float, seq: bool) -> Trace:
    """Step 1 (0..410 us): a gemm, then an all-reduce that ends at 400 on every rank, then a sync."""
    tr = Trace(rank=rank)
    for n, base in ((1, 0.0), (2, 1000.0)):  # step 2 is the last one: left out, like the window
        tr.step(n, base, 410)
        tr.kernel("gemm", base + 10, gemm_us, launch=(base + 1, 2))
        args = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float",
                "Group size": 2, "Process Group Name": "0"}  # fmt: skip
        if seq:
            args["Seq"] = n
        tr.host("record_param_comms", base + 120, 20, **args)
        tr.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", base + ar_start, 400 - ar_start, stream=20,
                  launch=(base + 125, 5))  # fmt: skip
        tr.runtime("cudaDeviceSynchronize", base + 130, 272)  # returns at 402, 2 us after the all-reduce
    return tr


@pytest.mark.parametrize("seq", [True, False])
def test_early_rank_waits_for_the_late_one(tmp_path, seq):
    # rank 0: gemm 10..110, all-reduce 150..400 -> 250 us on its path, of which 150..320 (170 us)
    # waits for rank 1, whose gemm runs 10..310 and whose all-reduce starts at 320
    _rank(0, 100, 150, seq).write(tmp_path, "rank0.json")
    _rank(1, 300, 320, seq).write(tmp_path, "rank1.json")
    rep = analyze_path(tmp_path)
    x = rep.cross_rank
    assert x is not None and x.matched_by == ("sequence number" if seq else "order")
    assert x.collectives_linked == 1
    r0, r1 = x.rows
    assert (r0.step, r0.rank, r1.rank) == (1, 0, 1)
    assert r0.path_us == pytest.approx(410) and r1.path_us == pytest.approx(410)
    assert r0.rank_wait_us == pytest.approx(170) and r0.waited_for == {"1": pytest.approx(170)}
    assert r1.rank_wait_us == 0 and r1.waited_for == {}
    (s,) = x.steps
    assert s.critical_rank == 1 and s.step_us == pytest.approx(410)
    # nobody waiting would not shorten the step: rank 1 never waited, and it takes 410 us
    assert s.balanced_us == pytest.approx(410) and x.balanced_step_ms == pytest.approx(0.41)
    assert "clocks" in x.note


def test_shown_and_in_json(tmp_path, capsys):
    _rank(0, 100, 150, True).write(tmp_path, "rank0.json")
    _rank(1, 300, 320, True).write(tmp_path, "rank1.json")
    assert main(["analyze", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Critical path across ranks" in out and "rank 1: 170.00 us" in out
    assert "the job's path runs through rank 1" in out
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["cross_rank"]["rows"][0]["waited_for"] == {"1": 170.0}


def test_real_two_rank_traces(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json.gz").write_bytes((DATA / f"gpu_2rank_rank{r}.json.gz").read_bytes())
    assert analyze_path(tmp_path / "rank0.json.gz").cross_rank is None  # one rank alone: nothing to link
    x = analyze_path(tmp_path).cross_rank
    assert x is not None and [(r.step, r.rank) for r in x.rows] == [(551, 0), (551, 1)]
    # both ranks' step-551 paths run on the host and through compute: no collective lies on them, so
    # nothing is waiting for another rank (their collectives' waiting overlaps host work)
    assert x.collectives_linked == 0 and all(r.rank_wait_us == 0 for r in x.rows)
    assert x.step_ms == pytest.approx(max(r.path_us for r in x.rows) / 1e3)
