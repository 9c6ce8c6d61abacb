"""``lmprof analyze --diff BEFORE AFTER`` on traces the test records with torch.profiler: a trace
against itself shows no change; doubling one op shows that op, an added op is new, a dropped one vanished."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lmprof.cli.main import main  # noqa: E402
from lmprof.trace.diff import diff_paths  # noqa: E402

DATA = Path(__file__).parent / "data" / "traces"
ROW = {"kind", "name", "status", "count_before", "count_after", "before_us", "after_us", "delta_us", "delta_pct"}


def _record(path: Path, mm_calls: int, last) -> Path:
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("block"):
                for _ in range(mm_calls):
                    torch.mm(x, x)
                last(x)
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    return _record(d / "a.json", 1, torch.relu), _record(d / "b.json", 2, torch.sigmoid)


def test_a_trace_diffed_with_itself_shows_no_change(pair) -> None:
    a, _ = pair
    d = diff_paths(a, a)
    assert d.rows == []
    assert all(s["changed"] == s["new"] == s["vanished"] == 0 for s in d.summary.values())
    assert d.summary["operator"]["unchanged"] > 0 and d.summary["annotation"]["unchanged"] == 1


def test_gpu_trace_diffed_with_itself_has_kernels_unchanged() -> None:
    d = diff_paths(DATA / "gpu_2rank_rank0.json.gz", DATA / "gpu_2rank_rank0.json.gz")
    assert d.rows == [] and d.summary["kernel"]["unchanged"] > 0
    assert d.step_before_ms == d.step_after_ms


def test_doubled_op_new_and_vanished(pair) -> None:
    a, b = pair
    d = diff_paths(a, b, top=100)
    ops = {r.name: r for r in d.rows if r.kind == "operator"}
    mm = ops["aten::mm"]
    assert (mm.count_before, mm.count_after, mm.status) == (3, 6, "changed")
    assert ops["aten::sigmoid"].status == "new" and ops["aten::sigmoid"].count_before == 0
    assert ops["aten::relu"].status == "vanished" and ops["aten::relu"].count_after == 0
    assert ops["aten::sigmoid"].delta_pct is None and ops["aten::relu"].after_us == 0.0
    # ranked by the size of the time delta within each kind
    sizes = [abs(r.delta_us) for r in d.rows if r.kind == "operator"]
    assert sizes == sorted(sizes, reverse=True)


def test_cli_diff_json_and_text(pair, capsys) -> None:
    a, b = pair
    assert main(["analyze", "--diff", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "lmprof.analyze.diff/1" and doc["before"] == str(a) and doc["after"] == str(b)
    assert all(set(r) == ROW for r in doc["rows"])
    assert main(["analyze", "--diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "aten::mm" in out and "3->6" in out and "new" in out and "vanished" in out


def test_cli_diff_refuses_a_folder_of_ranks(tmp_path, capsys) -> None:
    import shutil

    for r in (0, 1):
        shutil.copy(DATA / f"gpu_2rank_rank{r}.json.gz", tmp_path / f"r{r}.json.gz")
    assert main(["analyze", "--diff", str(tmp_path), str(DATA / "cpu_only_tiny.json.gz")]) == 2
    err = capsys.readouterr().err
    assert "two single traces" in err and len(err.strip().splitlines()) == 1
