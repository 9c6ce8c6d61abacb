"""The script's tqdm bar and lmprof's summary on one stderr: the run is written as its profiled window completes,
mid-loop, and its summary began on the bar's line ("...4.2it/s]lmprof train — ..."). tqdm's own
external_write_mode clears the bar first and draws it again after."""
from __future__ import annotations

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
