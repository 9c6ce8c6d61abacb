"""compare, the gate and the report say where runs' environments differ and which figures are not clean.

Runs are written field by field (docs/run-format.md), so the truth is known by construction: which
env facts differ, which run lmprof marked noisy, whose timing note says "first call".
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmprof.analysis.compare import compare_runs, env_differences
from lmprof.analysis.gate import gate, parse_condition
from lmprof.cli.main import main
from lmprof.errors import LmprofError
from lmprof.record.run import Env, Metric, Run
from lmprof.show.run_report import render_run_report
from lmprof.show.summary import render_text

FIRST = "first call: includes warm-up costs (timed on the very first call), not a clean timing"


def make_run(rid: str, step_ms: float = 10.0, *, env: dict[str, Any] | None = None, noisy: bool = False,
             first_call: bool = False, config: dict[str, Any] | None = None, spread: float = 0.01) -> Run:
    n = 1 if first_call else 10
    lo, hi = (step_ms, step_ms) if first_call else (step_ms * (1 - spread), step_ms * (1 + spread))
    metrics = {
        "step_time": Metric(value=step_ms, unit="ms", source="measured", p10=lo, p90=hi, n=n,
                            note=FIRST if first_call else "one step"),
        "tokens_per_s": Metric(value=512e3 / step_ms, unit="tokens/s", source="derived", p10=512e3 / hi,
                               p90=512e3 / lo, n=n),
        "mfu": Metric(value=300 / step_ms, unit="%", source="derived"),
        "memory.peak": Metric(value=1e6, unit="B", source="measured"),
        "params": Metric(value=1000, unit="count", source="measured"),
    }
    e = dict(device="cpu", device_name="AMD EPYC", torch="2.13.0", python="3.11", lmprof="0.1.0", os="Linux",
             cpu="AMD EPYC", threads=2, hostname="ci-1")
    e.update(env or {})
    return Run(id=rid, mode="train", created="2026-01-01T00:00:00Z", env=Env(**e),
               config={"preset": "tiny", "dtype": "fp32", **(config or {})}, metrics=metrics, noisy=noisy,
               noise=["other processes kept 1.96 of 2 cores busy during the timed window"] if noisy else [])


def save(run: Run, tmp_path: Path) -> str:
    return str(run.save(tmp_path / run.id))


# -- environments ---------------------------------------------------------------------------------


def test_threads_1_vs_2_on_cpu_is_listed_and_refused_unless_allowed(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", env={"threads": 1}), tmp_path)
    b = save(make_run("b", env={"threads": 2, "hostname": "ci-2"}), tmp_path)
    assert main(["compare", a, b, "--no-trace"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env.threads: 1 vs 2" in err and "--allow-env-diff" in err
    assert "hostname" not in err  # informational differences do not refuse
    assert main(["compare", a, b, "--no-trace", "--fail-on", "step_time>+5%"]) == 2  # nor judges the gate
    capsys.readouterr()
    assert main(["compare", a, b, "--no-trace", "--allow-env-diff"]) == 0
    out = capsys.readouterr().out
    # Listed first: before any figure.
    assert out.index("env.threads: 1 vs 2") < out.index("Figures") and "blocking" in out
    assert "informational: env.hostname: ci-1 vs ci-2" in out
    assert main(["compare", a, b, "--no-trace", "--allow-env-diff", "--json"]) == 0
    env = {d["key"]: d for d in json.loads(capsys.readouterr().out)["env"]}
    assert env["env.threads"]["blocking"] is True and env["env.threads"]["values"] == ["1", "2"]
    assert env["env.hostname"]["blocking"] is False


@pytest.mark.parametrize("key, a, b, blocking", [
    ("torch", "2.12.0", "2.13.0", True),
    ("device_name", "AMD EPYC", "Intel Xeon", True),
    ("cpu", "AMD EPYC", "Intel Xeon", True),
    ("lmprof", "0.1.0", "0.2.0", False),
    ("python", "3.11", "3.12", False),
    ("os", "Linux 6.1", "Linux 6.8", False),
])
def test_which_differences_block_on_a_cpu(key: str, a: str, b: str, blocking: bool) -> None:
    (d,) = [d for d in env_differences([make_run("a", env={key: a}), make_run("b", env={key: b})])
            if d.key == f"env.{key}"]
    assert d.blocking is blocking and d.values == (a, b)


def test_gpu_runs_block_on_the_device_not_on_the_host() -> None:
    gpu = {"device": "cuda:0", "device_name": "NVIDIA A100", "cuda": "12.4"}
    a = make_run("a", env={**gpu, "threads": 1, "cpu": "AMD EPYC"})
    b = make_run("b", env={**gpu, "device": "cuda:1", "threads": 8, "cpu": "Intel Xeon"})
    diffs = {d.key: d.blocking for d in env_differences([a, b])}
    assert diffs == {"env.device": False, "env.cpu": False, "env.threads": False}
    compare_runs([a, b])  # comparable as they are
    c = make_run("c", env={**gpu, "device_name": "NVIDIA H100"})
    with pytest.raises(LmprofError, match="device_name: NVIDIA A100 vs NVIDIA H100"):
        compare_runs([a, c])
    with pytest.raises(LmprofError, match=r"env\.device: cpu vs cuda:0"):
        compare_runs([make_run("cpu"), a])
    assert compare_runs([make_run("cpu"), a], allow_env_diff=True).env[0].blocking


def test_configuration_is_listed_never_refused_and_missing_facts_never_block() -> None:
    a, b = make_run("a"), make_run("b", config={"dtype": "bf16", "compile": True})
    b.env = Env(**{**b.env.model_dump(), "cuda": None})  # unrecorded in one run: listed only if it differs
    c = compare_runs([a, b])
    listed = {d.key: d for d in c.env}
    assert listed["config.dtype"].values == ("fp32", "bf16") and not listed["config.dtype"].blocking
    assert listed["config.compile"].values == ("—", "True")
    older = make_run("old")
    older.env = Env(**{k: v for k, v in a.env.model_dump().items() if k != "hostname"} | {"hostname": ""})
    extra = make_run("new", env={"gpu_sm_count": 108})  # recorded by one run only: not blocking
    assert not [d for d in env_differences([older, extra]) if d.blocking]


# -- noisy and first-call marks ---------------------------------------------------------------------


def test_compare_marks_the_issue_case_two_noisy_runs_1_82x(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", 18.2, noisy=True), tmp_path)
    b = save(make_run("b", 10.0, noisy=True), tmp_path)
    assert main(["compare", a, b, "--no-trace"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("step_time"))
    assert "1.82x better [noisy]" in row and "18.2 ms [noisy]" in row and "10 ms [noisy]" in row
    mem = next(line for line in out.splitlines() if line.lstrip().startswith("memory.peak"))
    assert "[noisy]" not in mem  # a peak-memory reading is not a timing
    assert "NOISY: other processes kept 1.96 of 2 cores busy" in out
    assert main(["compare", a, b, "--no-trace", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {m["key"]: m for m in data["metrics"]}
    assert rows["step_time"]["marks"] == [["noisy"], ["noisy"]] and rows["memory.peak"]["marks"] == [[], []]
    assert rows["mfu"]["marks"] == [["noisy"], ["noisy"]]  # derived from the step time: a timing too
    assert data["run_marks"][0][0].startswith("noisy: other processes")


def test_one_clean_one_noisy_marks_only_the_noisy_side_and_the_ratio(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    a, b = save(make_run("a", 10.0), tmp_path), save(make_run("b", 5.0, noisy=True), tmp_path)
    assert main(["compare", a, b, "--no-trace", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| step_time | 10 ms | 5 ms [noisy] | -50.0% [noisy] |" in out
    assert "**noisy**: other processes" in out


def test_first_call_figures_are_marked_and_the_gate_cannot_decide(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", 10.0), tmp_path)
    b = save(make_run("b", 20.0, first_call=True), tmp_path)  # twice as slow, but on its first call
    assert main(["compare", a, b, "--no-trace", "--fail-on", "step_time>+5%", "--fail-on", "peak_memory>+2%"]) == 3
    out = capsys.readouterr().out
    assert "20 ms [first call]" in out and "FIRST CALL: includes warm-up costs" in out
    assert "rests on a first-call figure" in out
    res = gate(Run.load(a), Run.load(b), [parse_condition("step_time>+5%"), parse_condition("peak_memory>+2%")])
    step, mem = res.checks
    assert step.verdict == "undecided" and step.marks == ("B first call",)
    assert mem.verdict == "pass" and mem.marks == ()  # memory is no timing
    assert res.first_call == (f"b: {FIRST}",)
    # Both first calls: still not judged (one call each, warm-up included).
    c = make_run("c", 10.0, first_call=True)
    assert gate(c, Run.load(b), [parse_condition("step_time>+5%")]).checks[0].verdict == "undecided"


def test_gate_failure_on_a_noisy_run_says_so_and_a_noisy_mfu_cannot_fail(tmp_path: Path) -> None:
    a, b = make_run("a", 10.0), make_run("b", 20.0, noisy=True)
    res = gate(a, b, [parse_condition("step_time>+5%"), parse_condition("mfu<-5%")])
    step, mfu = res.checks
    assert step.verdict == "fail" and step.marks == ("B noisy",)
    assert "warning: a run is marked noisy (B (b): other processes kept 1.96 of 2 cores busy" in step.reason
    # mfu halves too, but it has no recorded spread to be beyond and the run is noisy.
    assert mfu.verdict == "undecided" and "no recorded spread" in mfu.reason
    assert res.exit_code == 1
    clean = gate(a, make_run("c", 20.0), [parse_condition("mfu<-5%")]).checks[0]
    assert clean.verdict == "fail" and clean.marks == ()


def test_report_does_not_call_a_first_call_figure_a_clean_median(tmp_path: Path) -> None:
    run = make_run("a", 12.0, first_call=True)
    html = render_run_report(run, report_dir=tmp_path)
    card = html[html.index('data-key="step_time"'):]
    card = card[:card.index("</div></div>") + 12]
    assert "step time (clean median)" not in card and "first call, not a clean median" in card
    assert "12 ms [first call]" in html  # the figure tables carry the mark too
    noisy = render_run_report(make_run("b", 12.0, noisy=True), report_dir=tmp_path)
    card = noisy[noisy.index('data-key="step_time"'):]
    assert "noisy run: not to be trusted as it stands" in card[:card.index("</div></div>") + 12]
    mem = noisy[noisy.index('data-key="memory.peak"'):]
    assert "noisy run" not in mem[:mem.index("</div></div>") + 12]


def test_terminal_summary_marks_timed_figures() -> None:
    text = render_text(make_run("a", 12.0, first_call=True))
    row = next(line for line in text.splitlines() if line.lstrip().startswith("step_time"))
    assert "12 ms [first call]" in row
    run = make_run("b", 12.0, noisy=True)
    run.metrics["energy.total"] = Metric(value=None, unit="J", source="measured", note="n/a: no RAPL powercap interface")
    text = render_text(run)
    assert "12 ms [noisy]" in text and "977 KiB [noisy]" not in text
    # a figure the run has as n/a rests on no timing (the README's noisy run printed 'n/a [noisy]')
    energy = next(line for line in text.splitlines() if line.lstrip().startswith("energy.total"))
    assert "n/a" in energy and "[noisy]" not in energy


def test_hostile_env_values_stay_one_short_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = save(make_run("a", env={"hostname": "[bold]x[/bold] | y\nz" * 1000}), tmp_path)
    b = save(make_run("b", env={"hostname": "h"}), tmp_path)
    assert main(["compare", a, b, "--no-trace", "--format", "markdown"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "env.hostname" in x)
    assert len(line) < 300 and "\\|" in line and "[bold]x[/bold]" in line  # shown as text, pipes escaped
