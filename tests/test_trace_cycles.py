"""A ``tensorboard_trace_handler`` folder: one process's profiler cycles are cycles, not ranks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.fanout import analyze_path

torch = pytest.importorskip("torch")
# torch warns that a schedule without warm-up may skew times and that each cycle clears the last one's
# events: both are what a tensorboard_trace_handler user gets, and no time is checked here
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def cycles(tmp_path_factory) -> Path:
    """Two cycles of one process, recorded by torch.profiler as the tutorial saves them."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    out = tmp_path_factory.mktemp("tb") / "log"
    model = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(str(out))) as prof:
        for _ in range(2):
            model(x).sum().backward()
            prof.step()
    assert len(list(out.iterdir())) == 2
    return out


def test_one_process_cycles_are_not_ranks(cycles, capsys):
    rep = analyze_path(cycles)
    assert rep.ranks is None and rep.cycles is None and rep.cross_rank is None
    assert sorted(t.cycle for t in rep.traces) == [1, 2]
    assert len({t.process for t in rep.traces}) == 1
    first, second = sorted(rep.traces, key=lambda t: t.cycle)
    assert first.end_us <= second.start_us  # cycle 2 follows cycle 1 on the trace clock
    assert "profiler cycles" in rep.notes[0] and "not compared as ranks" in rep.notes[0]
    assert main(["analyze", str(cycles)]) == 0
    out = capsys.readouterr().out
    assert "slowest rank" not in out and "Ranks (" not in out and "cycle 2" in out


def test_several_processes_with_cycles_are_compared_per_cycle(cycles, tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    for f in cycles.iterdir():
        doc = json.loads(f.read_text())
        (folder / f.name).write_text(json.dumps(doc))
        for e in doc["traceEvents"]:
            if isinstance(e.get("pid"), int):
                e["pid"] += 1  # the same cycles from a second process
        (folder / ("other_" + f.name)).write_text(json.dumps(doc))
    rep = analyze_path(folder)
    assert rep.ranks is None and [c.cycle for c in rep.cycles] == [1, 2]
    assert all(len(c.ranks.ranks) == 2 for c in rep.cycles)
    assert [t.cycle for t in rep.traces] == [1, 1, 2, 2]
