"""Forward / backward / optimizer split per step, on traces the test records with torch.profiler;
truths are read from the trace JSON event by event."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from lmprof.cli.main import main  # noqa: E402
from lmprof.trace.load import load_trace  # noqa: E402
from lmprof.trace.phases import PHASES, phase_split  # noqa: E402

BWD = "autograd::engine::evaluate_function:"


def _record(path: Path, steps: bool) -> Path:
    from torch.profiler import ProfilerActivity, profile, schedule

    x = torch.randn(64, 64)
    w = torch.randn(64, 64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    sched = schedule(wait=0, warmup=0, active=3, repeat=1) if steps else None
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(4 if steps else 3):
            z = torch.mm(x, w).relu().sum()
            z.backward()
            opt.step()
            opt.zero_grad()
            if steps:
                prof.step()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("ph") / "steps.json", steps=True)


def test_phases_add_up_to_each_step_and_equal_the_events(stepped: Path) -> None:
    events = [e for e in json.loads(stepped.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    ph = phase_split(load_trace(stepped))
    assert ph.source == "ProfilerStep" and len(ph.steps) == len(steps) == 3
    for s, e in zip(ph.steps, steps):
        a, b = e["ts"], e["ts"] + e["dur"]
        assert s.step == int(e["name"].split("#")[1])
        assert s.step_us == pytest.approx(e["dur"], abs=1e-3)
        assert sum(s.phases_us.values()) == pytest.approx(s.step_us, abs=1e-3)
        within = [x for x in events if a <= x["ts"] and x["ts"] + x["dur"] <= b + 1e-3]
        opt = [x for x in within if x["name"].startswith(("Optimizer.step#", "Optimizer.zero_grad#"))]
        bwd = [x for x in within if x["name"].startswith(BWD)]
        bwd_start, bwd_end = min(x["ts"] for x in bwd), max(x["ts"] + x["dur"] for x in bwd)
        assert s.phases_us["optimizer"] == pytest.approx(sum(x["dur"] for x in opt), abs=1e-3)
        assert s.phases_us["backward"] == pytest.approx(bwd_end - bwd_start, abs=1e-3)
        assert s.phases_us["forward"] == pytest.approx(bwd_start - a, abs=1e-3)
        assert min(s.phases_us[p] for p in ("forward", "backward", "optimizer")) > 0
    assert sum(ph.total_pct.values()) == pytest.approx(100.0)


def test_iterations_cut_at_optimizer_step_without_profiler_steps(tmp_path: Path) -> None:
    path = _record(tmp_path / "plain.json", steps=False)
    ph = phase_split(load_trace(path))
    assert ph.source == "Optimizer.step" and len(ph.steps) == 3
    for s in ph.steps:
        assert s.step is None and sum(s.phases_us.values()) == pytest.approx(s.step_us, abs=1e-3)
        assert s.phases_us["backward"] > 0 and s.phases_us["optimizer"] > 0


def test_cli_shows_phases(stepped: Path, capsys) -> None:
    assert main(["analyze", str(stepped), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]["phases"]
    assert set(doc["total_us"]) == set(PHASES) and len(doc["steps"]) == 3
    assert main(["analyze", str(stepped)]) == 0
    assert "Phases per step" in capsys.readouterr().out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 400)), max_size=40),
       st.integers(-50, 1100), st.integers(0, 600), st.booleans())
def test_a_steps_window_cuts_the_same_intervals_as_scanning_them_all(spans, a, width, shuffle):
    """The bisection that finds a step's intervals gives what clipping every interval gives (the truth
    here: _clip over all of them), long intervals that start steps earlier included."""
    from lmprof.trace.phases import _clip, _Windowed

    spans = sorted(spans) if not shuffle else spans
    ts = np.array([float(s) for s, _ in spans])
    end = ts + np.array([float(d) for _, d in spans])
    rows = np.arange(len(spans))
    got = _Windowed(ts, end, rows).clip(float(a), float(a + width))
    want = _clip(ts, end, float(a), float(a + width))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
