"""lmprof next to the user's own torch.profiler: it never opens a profiler inside theirs, times no
step under it, and gives way when theirs starts during lmprof's window. The truth is the user's own
table and Chrome trace from the same script under plain python: the same operators with the same
call counts."""
from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.record.run import Run
from tests.test_usercode import plain, write

OWN = """
import sys, torch
from torch import nn
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step():
    m(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
before, after = int(sys.argv[1]), int(sys.argv[2])
for _ in range(before):
    step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(5):
        step()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=1000))
prof.export_chrome_trace(sys.argv[3])
for _ in range(after):
    step()
"""

FAST = ["--no-report", "--steps", "2", "--warmup", "1", "--profile-steps", "2"]


def table_ops(text: str) -> collections.Counter[tuple[str, int]]:
    """(operator, calls) of each row of key_averages().table(): its first and last columns."""
    rows = [line.split() for line in text.splitlines() if line.strip() and not line.startswith(("-", "Self", " Name"))]
    return collections.Counter((r[0], int(r[-1])) for r in rows if r[-1].isdigit())


def trace_ops(path: Path) -> collections.Counter[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return collections.Counter(e["name"] for e in events if e.get("cat") == "cpu_op")


@pytest.mark.parametrize("before,after,expect", [
    (0, 0, "nothing"),     # the lesson: the whole loop inside the user's profiler
    (0, 8, "after"),       # lmprof measures the steps after it
    (4, 0, "gives way"),   # the user's profiler starts inside lmprof's window
])
def test_users_profiler_table_and_trace_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  before: int, after: int, expect: str) -> None:
    script = write(tmp_path, "own.py", OWN)
    assert plain(script, before, after, tmp_path / "plain.json") == 0
    reference = capsys.readouterr().out
    out = tmp_path / "runs"
    code = main(["run", "--out", str(out), *FAST, str(script), str(before), str(after), str(tmp_path / "mine.json")])
    captured = capsys.readouterr()
    assert code == 0
    ops = table_ops(reference)
    assert len(ops) > 10 and table_ops(captured.out) == ops
    assert trace_ops(tmp_path / "mine.json") == trace_ops(tmp_path / "plain.json")
    assert not any(n.startswith("lmprof:") for n, _ in table_ops(captured.out))  # none of lmprof's scopes inside
    folders = [p for p in out.iterdir() if (p / "run.json").is_file()] if out.is_dir() else []
    if expect == "nothing":
        assert not folders
        assert "your own torch.profiler was running for" in captured.err and "lmprof steps aside" in captured.err
        return
    (folder,) = folders
    run = Run.load(folder)
    assert run.metrics["step_time"].n == 2
    if expect == "after":
        assert any(n.startswith("your own torch.profiler ran during 6 step(s): lmprof stepped aside") for n in run.notes)
        assert run.blocks  # its own window ran once the user's profiler had stopped
    else:
        assert any(n.startswith("your own torch.profiler started during lmprof's profiled window") for n in run.notes)
        assert "lmprof: your own torch.profiler started after 4 step(s)" in captured.err
        assert not run.blocks


def test_profile_inside_users_profiler(tmp_path: Path) -> None:
    """lmprof.profile() inside a torch.profiler block: no nested profiler, and the user's events are theirs."""
    import torch

    import lmprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile() as user, lmprof.profile(model, out=tmp_path, warmup=0, steps=2, profile_steps=1,
                                                         report=False, verbose=False) as prof:
        for _ in range(6):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.run is None and "lmprof steps aside" in (prof.message or "")
    names = {e.key for e in user.key_averages()}
    assert "aten::addmm" in names and not any(n.startswith(("lmprof:", "ProfilerStep")) for n in names)


GAVE_WAY = ("your own torch.profiler started during the figures step (a warm-up step): lmprof stopped its memory "
            "recording (two profilers cannot run at once): no memory measurement")
RAN = ("your own torch.profiler ran during the figures step (a warm-up step): no memory measurement was taken "
       "(lmprof never runs a profiler inside yours)")


@pytest.mark.parametrize("before,why,memory_note", [
    (2, "your own torch.profiler started during warm-up step 3", None),  # it starts in the counting step
    (1, "your own torch.profiler was running when warm-up step 3", GAVE_WAY),  # starts in the figures step
    (0, "your own torch.profiler was running when warm-up step 3", RAN),  # running as the figures step begins
])
def test_users_profiler_in_the_flops_step_stops_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          before: int, why: str, memory_note: str | None) -> None:
    """At the defaults, a model lmprof has no formulas for gets its FLOPs counted on warm-up step 3. The
    user's profiler starting then, or running when it begins, stops the count (FlopCounterMode is no
    profiler, but its cost per operator would be in the user's profile): inside the user's block no
    dispatch mode is on, and the user's table and trace are those of plain python."""
    own = OWN.replace("with profile(activities=[ProfilerActivity.CPU]) as prof:\n",
                      "with profile(activities=[ProfilerActivity.CPU]) as prof:\n"
                      "    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack\n"
                      "    print('dispatch modes in my profile:', len(_get_current_dispatch_mode_stack()), file=sys.stderr)\n")
    script = write(tmp_path, "own.py", own)
    assert plain(script, before, 20, tmp_path / "plain.json") == 0
    reference = capsys.readouterr()
    code = main(["run", "--out", str(tmp_path / "runs"), "--no-report", str(script), str(before), "20",
                 str(tmp_path / "mine.json")])
    captured = capsys.readouterr()
    assert code == 0
    assert "dispatch modes in my profile: 0" in reference.err and "dispatch modes in my profile: 0" in captured.err
    assert table_ops(captured.out) == table_ops(reference.out)
    assert trace_ops(tmp_path / "mine.json") == trace_ops(tmp_path / "plain.json")
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
    run = Run.load(folder)
    no_count = [n for n in run.notes if n.startswith("no FLOP count")]
    assert len(no_count) == 1 and why in no_count[0], run.notes
    assert run.value("flops.model_per_step") is None
    if memory_note is None:
        assert run.value("memory.peak")  # the figures step (2) was before the user's profiler
    else:  # it gave way to the user's profiler: one note says so, and no other says why there is no memory
        assert run.value("memory.peak") is None
        assert [n for n in run.notes if "memory" in n and n.startswith(("no memory", "your own"))] == [memory_note]
