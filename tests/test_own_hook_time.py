"""lmprof's own work inside someone else's step is not the step's: neither its time nor its 'other'.

Found on nanoGPT's loop under ``lmprof run``: the step's ``other`` row (the loop's own Python between
the phases) sat at 4-6% of the summed block time, near the 5% the attribution promises, and about half
of it was lmprof's: the step boundary's bookkeeping (the windows, the clock) and the optimizer hooks
before and after the optimizer's scope. The boundary's work now lies between one step's end mark and
the next one's start (outside both the step's time and its profiler range), and the hooks' own work is
timed by a range of its own (``lmprof:lmprof``) that the rows leave out.

Truth: delays of a known length placed in lmprof's own code (this test's sleeps), and the loop's own
stopwatch.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import lmprof
from lmprof.pipeline.protocol import probes as probes_mod
from lmprof.pipeline.protocol.windows.shapes import ShapesWindow
from lmprof.record.run import Run

SLEEP_S = 0.02  # each injected delay: far above a tiny step's own loop time and a busy machine's preemptions
STEPS = 8


def _loop(out: Path, stopwatch: list[float]) -> Run:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (4, 16))
    with lmprof.profile(model, out=out, report=False, verbose=False, warmup=1, steps=3, profile_steps=3) as prof:
        for _ in range(STEPS):
            t = time.perf_counter()
            logits = model(x)
            nn.functional.cross_entropy(logits.reshape(-1, 64), x.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            stopwatch.append(time.perf_counter() - t)
            prof.step()
    return Run.load(prof.folder)


def test_the_boundarys_own_work_is_not_in_the_step_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window that takes SLEEP_S at every step's end: the clean step time is the loop's, without it."""
    original = ShapesWindow.step_ends

    def slow(self: ShapesWindow, step: int) -> None:
        time.sleep(SLEEP_S)
        original(self, step)

    monkeypatch.setattr(ShapesWindow, "step_ends", slow)
    stopwatch: list[float] = []
    run = _loop(tmp_path, stopwatch)
    step_s = run.metrics["step_time"].value / 1e3
    loop_s = sorted(stopwatch)[len(stopwatch) // 2]  # the loop's own stopwatch: prof.step() not in it
    # the old step time held the boundary: loop + SLEEP_S
    assert step_s < loop_s + SLEEP_S / 2, (step_s, loop_s)


def test_the_hooks_own_work_is_left_out_of_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SLEEP_S in lmprof's optimizer hooks before the optimizer's scope and after it, and in its
    forward hook's batch count: none of it in the rows; the record says how much was left out."""
    before, after = probes_mod.Probes.optimizer_begin, probes_mod.Probes.optimizer_end
    count = probes_mod.forward_tokens

    def begin(self: probes_mod.Probes) -> None:
        if self.active:
            time.sleep(SLEEP_S)
        before(self)

    def end(self: probes_mod.Probes) -> None:
        after(self)
        if self.active:
            time.sleep(SLEEP_S)

    def tokens(*args: object, **kwargs: object) -> object:
        time.sleep(SLEEP_S)
        return count(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(probes_mod.Probes, "optimizer_begin", begin)
    monkeypatch.setattr(probes_mod.Probes, "optimizer_end", end)
    monkeypatch.setattr(probes_mod, "forward_tokens", tokens)
    run = _loop(tmp_path, [])
    rows = {(b.name, b.phase): b.time_ms for b in run.blocks}  # medians over the profiled steps
    other = sum(v for (n, _), v in rows.items() if n == "other")
    assert other < 0.5 * sum(rows.values()), rows  # three delays a step: the old rows' 'other' was nearly all of it
    assert "lmprof" not in {b.name for b in run.blocks}
    row = run.tables["attribution"][0]
    assert 3 * SLEEP_S * 1e3 <= row["lmprof_ms_per_step"] < 4 * SLEEP_S * 1e3, row  # a sleep may overrun a little
    assert "lmprof's own hooks" in row["correction"]


def greedy_run(tmp_path: Path, token_choice: Callable[[], None] = lambda: None, forwards: int = 4) -> Run:
    """A hand-written greedy decoding loop under ``lmprof.profile(infer=True)`` (a prefill and
    ``forwards - 1`` decode steps a generation); ``token_choice`` runs after each forward, as the loop's own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, infer=True, report=False, verbose=False,
                                         warmup=1, steps=2, profile_steps=1) as prof:
        for _ in range(4):
            ids = torch.randint(0, 64, (2, 8))
            for _ in range(forwards):
                logits = model(ids)
                token_choice()
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
            prof.step()
    return Run.load(prof.folder)


def test_the_forward_hooks_own_work_in_a_generation_is_left_out_of_decode(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """SLEEP_S in lmprof's work at each forward's end of a profiled generation (where the decode scope
    turns over): not in the decode rows' 'other' nor 'generate_loop'."""
    after = probes_mod.Probes.forward_end

    def end(self: probes_mod.Probes) -> None:
        after(self)
        time.sleep(SLEEP_S)

    monkeypatch.setattr(probes_mod.Probes, "forward_end", end)
    run = greedy_run(tmp_path)
    decode = {b.name: b.profiled_ms for b in run.blocks if b.phase == "decode"}  # as profiled, not scaled
    loop = decode.get("other", 0.0) + decode.get("generate_loop", 0.0)  # what is outside the model's forward
    assert loop < SLEEP_S * 1e3, decode  # three delays in decode: the old rows held them all
    row = run.tables["attribution"][0]
    assert 4 * SLEEP_S * 1e3 <= row["lmprof_ms_per_step"] < 5 * SLEEP_S * 1e3, row  # four forwards' ends


def test_the_loops_own_work_between_forwards_is_the_generate_loop_row(tmp_path: Path) -> None:
    """A generation's time outside the model's forward (claimed whole by model_glue) is the generation
    loop's, ``generate_loop`` (it was 'other'): a token choice slowed by SLEEP_S after each forward is there,
    and in none of the model's rows. Truth: the loop's own sleeps."""
    run = greedy_run(tmp_path, lambda: time.sleep(SLEEP_S))
    rows = {(b.name, b.phase): b.profiled_ms for b in run.blocks}
    # decode runs from the first forward's end on: at least the three decode steps' token choices in it
    assert rows[("generate_loop", "decode")] >= 3 * SLEEP_S * 1e3, rows
    assert ("other", "decode") not in rows, rows
    model_rows = sum(v for (n, p), v in rows.items() if p == "decode" and n != "generate_loop")
    assert model_rows < SLEEP_S * 1e3, rows  # none of the sleeps in the model's rows
