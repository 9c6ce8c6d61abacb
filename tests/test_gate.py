"""`lmprof compare --fail-on`: the noise-aware CI gate, on run folders written by hand (docs/run-format.md).

Truth here is arithmetic on the hand-chosen figures: a doubled step time is +100 %, and two spreads
overlap or not by construction.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.analysis.gate import check, gate, parse_condition
from lmprof.cli.main import main
from lmprof.errors import ConfigError
from lmprof.record.run import Env, Metric, Run

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 65}


def make_run(rid: str, step_ms: float, spread: float = 0.02, *, peak: float = 1e6, noisy: bool = False) -> Run:
    """A train run whose step_time has median ``step_ms`` and p10/p90 at -/+ ``spread`` of it."""
    metrics = {
        "step_time": Metric(value=step_ms, unit="ms", source="measured", p10=step_ms * (1 - spread),
                            p90=step_ms * (1 + spread), n=10),
        "tokens_per_s": Metric(value=512e3 / step_ms, unit="tokens/s", source="derived",
                               p10=512e3 / (step_ms * (1 + spread)), p90=512e3 / (step_ms * (1 - spread)), n=10),
        "memory.peak": Metric(value=peak, unit="B", source="measured"),
        "energy.total": Metric.na("J", "no RAPL powercap interface on this machine"),
        "params": Metric(value=1000, unit="count", source="measured"),
    }
    return Run(id=rid, mode="train", created="2026-01-01T00:00:00Z",
               env=Env(device="cpu", device_name="t", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1),
               config={"preset": "tiny", "model": dict(TINY)}, metrics=metrics, noisy=noisy,
               noise=["steps spread 1.60x (p90/p10)"] if noisy else [])


def save(run: Run, tmp_path: Path) -> str:
    return str(run.save(tmp_path / run.id))


RULES = ["--fail-on", "step_time>+5%", "--fail-on", "peak_memory>+2%"]


def test_run_against_itself_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", 10.0), tmp_path)
    assert main(["compare", a, a, "--no-trace", *RULES]) == 0
    assert "gate: pass" in capsys.readouterr().out


def test_doubled_step_time_fails_naming_the_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = save(make_run("a", 10.0), tmp_path), save(make_run("b", 20.0), tmp_path)
    assert main(["compare", a, b, "--no-trace", *RULES]) == 1
    out = capsys.readouterr().out
    assert "gate: FAIL (step_time)" in out and "memory.peak" not in out.split("gate:")[-1]
    res = gate(Run.load(a), Run.load(b), [parse_condition("step_time>+5%")])
    c = res.checks[0]
    assert c.verdict == "fail" and c.change_pct == pytest.approx(100.0)
    # near ends: B's p10 (19.6) against A's p90 (10.2)
    assert c.near_change_pct == pytest.approx(100 * (19.6 / 10.2 - 1))


def test_two_noisy_runs_cannot_decide(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # +10 % on the medians, but each run spreads +-30 % and lmprof marked both noisy.
    a = save(make_run("a", 10.0, spread=0.3, noisy=True), tmp_path)
    b = save(make_run("b", 11.0, spread=0.3, noisy=True), tmp_path)
    assert main(["compare", a, b, "--no-trace", "--fail-on", "step_time>+5%"]) == 3
    out = capsys.readouterr().out
    assert "cannot decide" in out and "too noisy" in out


def test_overlapping_spreads_without_noisy_flag_cannot_decide() -> None:
    a, b = make_run("a", 10.0, spread=0.1), make_run("b", 10.8, spread=0.1)
    c = check(a, b, parse_condition("step_time>+5%"))
    assert c.verdict == "undecided" and "overlap" in c.reason
    assert c.change_pct == pytest.approx(8.0)


def test_noisy_runs_still_fail_beyond_their_spread() -> None:
    a, b = make_run("a", 10.0, spread=0.3, noisy=True), make_run("b", 30.0, spread=0.3, noisy=True)
    assert check(a, b, parse_condition("step_time>+5%")).verdict == "fail"


def test_drop_rule_and_exact_memory() -> None:
    a, b = make_run("a", 10.0, peak=1_000_000), make_run("b", 20.0, peak=1_030_000)
    tps = check(a, b, parse_condition("tokens_per_s<-5%"))
    assert tps.verdict == "fail" and tps.change_pct == pytest.approx(-50.0)
    mem = check(a, b, parse_condition("peak_memory>+2%"))  # no spread recorded: one exact reading
    assert mem.verdict == "fail" and mem.change_pct == pytest.approx(3.0)
    assert check(a, b, parse_condition("peak_memory>+5%")).verdict == "pass"


def test_na_figure_cannot_decide() -> None:
    c = check(make_run("a", 10.0), make_run("b", 10.0), parse_condition("energy>+5%"))
    assert c.verdict == "undecided" and "n/a" in c.reason


@pytest.mark.parametrize("bad", ["step_time>5", "step_time>-5%", "tokens_per_s<+5%", "step time>+5%", ">+5%", ""])
def test_bad_rule_is_one_line_exit_2(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError):
        parse_condition(bad)
    a = save(make_run("a", 10.0), tmp_path)
    assert main(["compare", a, a, "--no-trace", "--fail-on", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fail-on" in err


def test_unknown_figure_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", 10.0), tmp_path)
    assert main(["compare", a, a, "--no-trace", "--fail-on", "ttft>+5%"]) == 2
    assert "neither run has a figure 'ttft'" in capsys.readouterr().err


def test_markdown_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = save(make_run("a", 10.0), tmp_path), save(make_run("b", 20.0), tmp_path)
    assert main(["compare", a, b, "--format", "markdown", *RULES]) == 1
    out = capsys.readouterr().out
    assert out.startswith("## lmprof performance gate: ❌ fail")
    lines = out.splitlines()
    rule = next(line for line in lines if line.startswith("| step_time>+5%"))
    assert "+100.0%" in rule and "❌ fail" in rule
    assert next(line for line in lines if line.startswith("| peak_memory>+2%")).count("✅ pass") == 1
    assert "| step_time | 10 ms | 20 ms | +100.0% |" in out


def test_json_carries_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    a = save(make_run("a", 10.0), tmp_path)
    assert main(["compare", a, a, "--no-trace", "--json", *RULES]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gate"]["verdict"] == "pass" and len(data["gate"]["checks"]) == 2


def test_noisy_timing_does_not_hold_back_memory() -> None:
    a = make_run("a", 10.0, spread=0.3, noisy=True)
    b = make_run("b", 11.0, spread=0.3, noisy=True)
    assert check(a, b, parse_condition("peak_memory>+2%")).verdict == "pass"  # same exact reading
    assert check(a, b, parse_condition("step_time>+5%")).verdict == "undecided"
