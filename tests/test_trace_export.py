"""`lmprof analyze --export DIR`: Parquet tables checked against a trace written event by event."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from lmprof.cli.main import main
from lmprof.errors import DataError, LmprofError
from lmprof.trace.fanout import analyze_path
from test_trace_synthetic import T0, Trace

DATA = Path(__file__).parent / "data" / "traces"


def _trace() -> Trace:
    """Three steps; step 1: op launches k1 (10 us) and k2 (5 us, overlapping k1 by 2 us); step 2: one
    graph launch of two kernels (3 + 4 us); step 3 (last, left out of device figures): one kernel."""
    tr = Trace()
    tr.step(1, 0, 100)
    tr.host("aten::mm", 1, 20)
    tr.kernel("k1", 30, 10, launch=(2, 5))  # runtime call inside aten::mm
    tr.kernel("k2", 38, 5, stream=8, launch=(10, 5))
    tr.step(2, 100, 100)
    corr = tr.runtime("cudaGraphLaunch", 110, 6)
    tr.device("g1", 120, 3, corr=corr)
    tr.device("g2", 124, 4, corr=corr)
    tr.step(3, 200, 100)
    tr.kernel("k3", 220, 7, launch=(205, 4))
    return tr


def _read(folder: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(folder / f"{name}.parquet")


def test_tables_hold_hand_computed_values(tmp_path):
    out = tmp_path / "out"
    analyze_path(_trace().write(tmp_path), export=out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{t}.parquet" for t in ("events", "kernels", "launches", "ops", "steps", "collectives", "critical_path")
    )
    assert _read(out, "collectives").empty  # no communication kernel
    ev = _read(out, "events")
    assert len(ev) == 3 + 1 + 4 + 5  # steps, op, runtime calls, device events
    k = _read(out, "kernels").set_index("name")
    assert list(k.index) == ["k1", "k2", "g1", "g2", "k3"]
    assert [x if isinstance(x, str) else "-" for x in k["op_name"]] == ["aten::mm", "aten::mm", "-", "-", "-"]
    assert k.loc["k1", "launch_delay_us"] == pytest.approx(28.0)
    assert list(k["step"]) == [1, 1, 2, 2, 3]
    assert list(k["graph_launched"]) == [False, False, True, True, False]
    assert list(k["in_device_figures"]) == [True, True, True, True, False]  # last step left out
    assert k.loc["g1", "launch_name"] == "cudaGraphLaunch" and k.loc["k1", "ts_us"] == pytest.approx(T0 + 30)
    la = _read(out, "launches")
    assert list(la["device_events"]) == [1, 1, 2, 1] and list(la["graph"]) == [False, False, True, False]
    ops = _read(out, "ops")
    assert list(ops["name"]) == ["aten::mm"]
    assert ops["self_us"].iloc[0] == pytest.approx(20 - 5 - 5)  # two runtime calls inside
    st = _read(out, "steps").set_index("step")
    assert list(st["dur_us"]) == [100, 100, 100] and list(st["ops"]) == [1, 0, 0]
    assert list(st["device_events"]) == [2, 2, 1]
    assert list(st["device_time_us"]) == pytest.approx([15, 7, 7])
    assert list(st["device_busy_us"]) == pytest.approx([13, 7, 7])  # k1 30..40 U k2 38..43 = 13
    assert st.loc[1, "device_start_us"] - T0 == pytest.approx(30) and st.loc[1, "device_end_us"] - T0 == pytest.approx(43)


def test_documented_pandas_query_runs(tmp_path):
    out = tmp_path / "out"
    analyze_path(DATA / "a100_nccl_rank0.json.gz", export=out)
    k = pd.read_parquet(out / "kernels.parquet")
    top = (k[k.in_device_figures].groupby(["op_name", "type"], dropna=False)["dur_us"].sum()
           .sort_values(ascending=False).head(5))  # fmt: skip
    assert len(top) == 5 and top.iloc[0] > 0
    assert set(k["type"]) == {"computation", "communication", "memory"}


def test_several_ranks_share_the_files(tmp_path):
    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", tmp_path)
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path), "--export", str(out)]) == 0
    ev = _read(out, "events")
    assert ev.groupby("rank").size().to_dict() == {0: 4811, 1: 4676}


def test_export_to_a_file_is_refused_before_reading(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(LmprofError, match="not a folder"):
        analyze_path(DATA / "cpu_only_tiny.json.gz", export=target)
    assert main(["analyze", str(DATA / "cpu_only_tiny.json.gz"), "--export", str(target)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_failed_trace_leaves_no_partial_tables(tmp_path):
    (tmp_path / "a.json").write_bytes((DATA / "cpu_only_tiny.json.gz").read_bytes())
    (tmp_path / "b.json").write_bytes(b"{broken")
    out = tmp_path / "out"
    with pytest.raises(DataError):
        analyze_path(tmp_path, export=out)
    assert list(out.iterdir()) == []


def test_collectives_and_critical_path_tables(tmp_path):
    """The all-reduce of tests/test_trace_crossrank.py on rank 0: 1,024 floats on 2 ranks, 150..400 us."""
    from test_trace_crossrank import _rank

    _rank(0, 100, 150, True).write(tmp_path, "rank0.json")
    out = tmp_path / "out"
    analyze_path(tmp_path / "rank0.json", export=out)
    (c,) = _read(out, "collectives").itertuples()
    assert (c.kind, c.process_group, c.seq, c.dtype, c.group_size) == ("allreduce", "0", 1, "Float", 2)
    assert c.message_bytes == 4096 and c.start_us - T0 == pytest.approx(150) and c.time_us == pytest.approx(250)
    assert c.algbw_gbps == pytest.approx(4096 / 250e-6 / 1e9)  # bytes / s / 1e9
    assert c.busbw_gbps == pytest.approx(c.algbw_gbps)  # all-reduce on 2 ranks: factor 2 (n - 1) / n = 1
    (p,) = _read(out, "critical_path").itertuples()
    # back from 410: host 402..410, sync 400..402, all-reduce 150..400, latency 130..150, the launch
    # call 125..130, host 0..125 (with the gemm's launch call 1..3 inside)
    assert p.step == 1 and p.step_us == pytest.approx(410)
    assert p.communication_us == pytest.approx(250) and p.sync_us == pytest.approx(2)
    assert p.launch_latency_us == pytest.approx(20) and p.launch_call_us == pytest.approx(5 + 2)
    assert p.cpu_us == pytest.approx(410 - 250 - 2 - 20 - 7)
