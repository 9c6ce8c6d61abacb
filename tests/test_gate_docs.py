"""docs/ci-gate.md, `lmprof compare --help` and the gate say the same thing: the docs' examples are run.

The truth is the docs' own table, read here row by row, and arithmetic on hand-made runs: a figure
moved by twice a rule's threshold in the rule's direction, with tight spreads, must fail (exit 1);
by half of it, pass (exit 0); the same move the other way, pass; a refused rule, exit 2 and one line.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from lmprof.analysis import gate
from lmprof.cli.main import main
from lmprof.record.run import Env, Metric, Run

DOC = Path(__file__).resolve().parents[1] / "docs" / "ci-gate.md"
TEXT = DOC.read_text(encoding="utf-8")


def rule_rows() -> list[dict[str, str]]:
    """The rows of the docs' rule table: rule, figure, fails when it, by more than, accepted."""
    rows = []
    for line in TEXT.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[4].split(":")[0] in ("yes", "no"):
            rows.append(dict(zip(("rule", "figure", "direction", "pct", "accepted"), cells)))
    return rows


ROWS = rule_rows()


def test_the_docs_table_was_found_and_covers_both_directions() -> None:
    accepted = [r for r in ROWS if r["accepted"] == "yes"]
    assert len(ROWS) >= 10 and {r["direction"] for r in accepted} == {"grows", "drops"}
    # The refusals are symmetric: an unsigned and a wrongly signed rule in each direction.
    refused = {r["rule"].strip("`") for r in ROWS if r["accepted"].startswith("no")}
    assert {"step_time>5%", "tokens_per_s<5%", "step_time>-5%", "tokens_per_s<+5%"} <= refused


BASE = {"step_time": (10.0, "ms"), "tokens_per_s": (51_200.0, "tokens/s"), "memory.peak": (1e9, "B"), "mfu": (40.0, "%")}


def run_with(rid: str, scale: dict[str, float]) -> Run:
    """A clean train run with BASE's figures times ``scale``; timings spread +-0.1 %."""
    metrics = {}
    for key, (value, unit) in BASE.items():
        v = value * scale.get(key, 1.0)
        spread = {"p10": v * 0.999, "p90": v * 1.001, "n": 10} if key in ("step_time", "tokens_per_s") else {}
        metrics[key] = Metric(value=v, unit=unit, source="measured", **spread)
    return Run(id=rid, mode="train", created="2026-01-01T00:00:00Z",
               env=Env(device="cpu", device_name="t", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1),
               config={"preset": "tiny"}, metrics=metrics)


@pytest.mark.parametrize("row", [r for r in ROWS if r["accepted"] == "yes"], ids=lambda r: r["rule"])
def test_accepted_rule_means_what_the_docs_say(row: dict[str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rule = row["rule"].strip("`")
    pct = float(row["pct"].rstrip(" %"))
    sign = 1.0 if row["direction"] == "grows" else -1.0
    cond = gate.parse_condition(rule)
    assert (cond.metric, cond.pct) == (row["figure"], pct)
    base = str(run_with("a", {}).save(tmp_path / "a"))
    for name, move, code in (("twice", 2 * pct, 1), ("half", pct / 2, 0), ("other way", -2 * pct, 0)):
        new = str(run_with(name.replace(" ", "-"), {row["figure"]: 1 + sign * move / 100}).save(tmp_path / name))
        assert main(["compare", base, new, "--no-trace", "--fail-on", rule]) == code, (rule, name)
    capsys.readouterr()


@pytest.mark.parametrize("row", [r for r in ROWS if r["accepted"].startswith("no")], ids=lambda r: r["rule"])
def test_refused_rule_exits_2_with_one_line(row: dict[str, str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rule = row["rule"].strip("`")
    a = str(run_with("a", {}).save(tmp_path / "a"))
    assert main(["compare", a, a, "--no-trace", "--fail-on", rule]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fail-on" in err


def test_the_commands_at_the_top_of_the_docs_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"```bash\n(.*?)```", TEXT, re.S)
    assert block is not None
    a, b = str(run_with("a", {}).save(tmp_path / "a")), str(run_with("b", {}).save(tmp_path / "b"))
    commands = [line for line in block.group(1).splitlines() if line.startswith("lmprof compare")]
    assert len(commands) == 2
    for line in commands:
        argv = shlex.split(line.split(">>")[0])[1:]
        argv = [a if x == "BASE" else b if x == "NEW" else x for x in argv]
        assert main(argv) == 0, line  # identical figures pass every rule
    capsys.readouterr()


def test_help_gives_the_form_the_parser_takes() -> None:
    from lmprof.cli.app import app
    from lmprof.cli.main import _register_verbs

    _register_verbs()
    compare = typer.main.get_command(app).commands["compare"]  # type: ignore[attr-defined]
    help_text = next(p.help for p in compare.params if p.name == "fail_on")
    assert gate.FORM in help_text and "sign is required" in help_text
    # The form, filled in, parses; each example parses and is an accepted row of the docs.
    gate.parse_condition(gate.FORM.split(" (")[0].replace("METRIC", "step_time").replace("X", "5"))
    accepted = {r["rule"].strip("`") for r in ROWS if r["accepted"] == "yes"}
    for example in gate.EXAMPLES:
        gate.parse_condition(example)
        assert example in accepted
