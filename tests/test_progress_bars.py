"""The script's tqdm bar and lmprof's summary on one stderr: the run is written as its profiled window completes,
mid-loop, and its summary began on the bar's line ("...4.2it/s]lmprof train — ..."). tqdm's own
external_write_mode clears the bar first and draws it again after."""
from __future__ import annotations

import io
import re

import pytest

LOOP = """
import sys, torch
from tqdm import tqdm
m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in tqdm(range(12), file=sys.stderr, mininterval=0, ascii=True):
    m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_the_summary_mid_loop_does_not_start_on_the_scripts_progress_bar(run_script):
    pytest.importorskip("tqdm")
    r = run_script(LOOP, "--warmup", "1", "--steps", "2", "--profile-steps", "1")
    assert r.code == 0 and r.record is not None
    start = r.err.index("lmprof train — ")
    before = r.err[:start]
    # the bar was there (drawn before the window completed) and was cleared: a carriage return and blanks
    # over its text, so the summary starts at the line's beginning
    assert re.search(r"\|[#]* *\| *\d+/12", before), before
    assert re.search(r"\r +\r$", before), repr(before[-120:])
    # and drawn again after it: the bar's count goes on to 12/12 below the summary
    assert "12/12" in r.err[start:]


def _rich_bar(screen: io.StringIO):  # noqa: ANN202
    """A rich progress bar drawn on ``screen`` as on a terminal: while it runs, sys.stderr is rich's proxy."""
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(file=screen, force_terminal=True, width=100, color_system=None))


def _bar_lines(screen: str) -> list[str]:
    """The lines of a terminal's output as drawn: each carriage return starts its line again, and the cursor
    moves and line erasures that follow it leave the text after them at the line's start."""
    return [re.sub(r"^(\x1b\[[0-9;]*[A-Za-z])+", "", line.rsplit("\r", 1)[-1]) for line in screen.split("\n")]


def test_the_summary_mid_loop_goes_above_a_rich_progress_bar(tmp_path, capsys):
    """rich's Progress replaces sys.stderr with a proxy that prints above the bar; a Console given that proxy
    wrote past it, onto the bar's line ("... 53% 0:00:01lmprof train — ...")."""
    from test_written_when_complete import _profiled_loop

    screen = io.StringIO()
    with _rich_bar(screen) as progress:
        task = progress.add_task("training", total=8)
        _profiled_loop(tmp_path, 8, lambda i, prof: (progress.advance(task), progress.refresh()), verbose=True)
    drawn = screen.getvalue()
    # everything lmprof said went above the bar, through the bar's own console: none of it past it to stderr
    assert "lmprof train — " in drawn and "run folder: " in drawn, drawn[-400:]
    assert "lmprof train" not in capsys.readouterr().err
    lines = _bar_lines(drawn)
    for said in ("lmprof train — ", "run folder: ", "note: "):
        (first, *_) = [line for line in lines if said in line]
        assert first.startswith(said), repr(first)  # never after the bar's text
    assert any("training" in line and "100%" in line for line in lines)  # and the bar went on below it


def test_the_watch_prints_plain_lines_above_a_rich_progress_bar():
    """The watch's lines go through the bar's proxy, above the bar, as the summary does (a Console given the
    proxy wrote past it, onto the bar's line)."""
    from lmprof.show.watch_panel import WatchPanel

    screen = io.StringIO()
    with _rich_bar(screen) as progress:
        progress.add_task("training", total=8)
        panel = WatchPanel()  # on sys.stderr, which the bar's display holds now
        panel.say("a capture was taken")
        progress.refresh()
    lines = _bar_lines(screen.getvalue())
    (said,) = [line for line in lines if "a capture was taken" in line]
    assert said.startswith("lmprof watch: a capture was taken"), repr(said)
